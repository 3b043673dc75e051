//! Human-readable descriptions of actions, in kernel terms, for counterexamples: the action is
//! replayed on a copy of the machine with step labels switched on, and the labels it produced are
//! joined (falling back to the function name and step).

use crate::machine::{Action, Machine};
use crate::state::INIT_MM;
use shootdown_engine::trace::TraceEvent;
use shootdown_engine::{Env, Model, Time};

/// An `Env` that charges nothing and always chooses 0: what the explorer runs steps with.
pub struct NullEnv;

impl Env for NullEnv {
    fn timed(&self) -> bool {
        false
    }
    fn now(&self) -> Time {
        Time::ZERO
    }
    fn charge(&mut self, _: Time) {}
    fn random(&mut self, _: u64) -> u64 {
        0
    }
    fn wake(&mut self, _: usize, _: Time) {}
    fn notify(&mut self) {}
    fn notify_key(&mut self, _: u64) {}
    fn tracing(&self) -> bool {
        false
    }
    fn trace(&mut self, _: TraceEvent) {}
}

fn frame_context(m: &Machine, cpu: usize) -> String {
    let c = &m.cpus[cpu];
    let top = c
        .irq_stack
        .last()
        .or_else(|| m.tasks[c.curr as usize].stack.last());
    match top {
        Some(f) => f.name().to_string(),
        None if m.is_idle_cpu(cpu) => "idle".to_string(),
        None => {
            let t = &m.tasks[c.curr as usize];
            let mode = if t.mm.is_some() { "user" } else { "kthread" };
            format!("{} ({mode})", t.name)
        }
    }
}

pub fn describe(m: &Machine, a: Action) -> String {
    match a {
        Action::Interrupt(_) => {
            return "take CALL_FUNCTION IPI (enter call_function_interrupt)".into()
        }
        Action::Drain(c) => {
            if let Some((loc, v)) = m.sb(c as usize).oldest() {
                return format!(
                    "store buffer drains {loc:?} = {}",
                    if *v == u64::MAX {
                        "LOADED_MM_SWITCHING".into()
                    } else {
                        v.to_string()
                    }
                );
            }
            return "store buffer drains".into();
        }
        Action::Fill(c, i) => {
            let (mm, vpn) = m.spec_pages[i as usize];
            let lazy =
                if m.cpus[c as usize].tlbstate.is_lazy || m.cpus[c as usize].tlbstate.legacy_lazy {
                    " (lazy)"
                } else {
                    ""
                };
            let _ = INIT_MM;
            return format!("page walker{lazy}: speculative fill of mm{mm} page {vpn:#x}");
        }
        Action::Step(c) if c as usize >= m.cpus.len() => {
            let top = m.host_stack(c as usize).last().map(|f| f.name());
            let text = step_text(m, a);
            return match top {
                Some(f) if !text.is_empty() => format!("{f}: {text}"),
                Some(f) => f.to_string(),
                None => text,
            };
        }
        Action::Step(c) if m.in_host_code(c as usize) => {
            let top = m.host_stack(c as usize).last().map(|f| f.name());
            let text = step_text(m, a);
            // vcpu_run's steps name the functions they run; the others are prefixed with theirs.
            return match top {
                Some(f) if f != "vcpu_run" => format!("host: {f}: {text}"),
                _ => format!("host: {text}"),
            };
        }
        Action::VcpuPut(_) | Action::VcpuIoctl(_) | Action::HostIrq(_) => {
            let mut copy = m.clone();
            copy.perf.labels_on = true;
            copy.perf.labels.clear();
            copy.apply(a, &mut NullEnv);
            return format!("host: {}", copy.perf.labels.join("; "));
        }
        Action::Step(_) => {}
    }
    let Action::Step(c) = a else { unreachable!() };
    let ctx = frame_context(m, c as usize);
    let mut copy = m.clone();
    copy.perf.labels_on = true;
    copy.perf.labels.clear();
    copy.perf.summary = None;
    copy.apply(a, &mut NullEnv);
    if !copy.perf.labels.is_empty() {
        format!("{ctx}: {}", copy.perf.labels.join("; "))
    } else if let Some(s) = copy.perf.summary.take() {
        format!("{ctx}: {s}")
    } else {
        ctx
    }
}

impl Machine {
    /// Describe what the current step does, in kernel terms (kept only while replaying a
    /// counterexample, so the closure costs nothing in normal runs).
    #[inline]
    pub(crate) fn say(&mut self, f: impl FnOnce() -> String) {
        if self.perf.labels_on {
            let s = f();
            self.perf.labels.push(s);
        }
    }

    /// What the current step does, in kernel terms, when nothing it calls says more (kept only
    /// while replaying a counterexample). A later summary of the same step replaces an earlier
    /// one.
    #[inline]
    pub(crate) fn summary(&mut self, f: impl FnOnce() -> String) {
        if self.perf.labels_on {
            self.perf.summary = Some(f());
        }
    }
}

/// What a step says of itself (its labels, else its summary): apply it to a copy of `m` with
/// labels on.
fn step_text(m: &Machine, a: Action) -> String {
    let mut copy = m.clone();
    copy.perf.labels_on = true;
    copy.perf.labels.clear();
    copy.perf.summary = None;
    copy.apply(a, &mut NullEnv);
    if copy.perf.labels.is_empty() {
        copy.perf.summary.take().unwrap_or_default()
    } else {
        copy.perf.labels.join("; ")
    }
}
