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
            let mode = if t.kthread { "kthread" } else { "user" };
            format!("{} ({mode})", t.name)
        }
    }
}

impl Machine {
    /// `text` with each mm the model names by index (`mm3`, as step texts write it: cheap on
    /// the hot path) replaced by that mm's own name (`init_mm`, or the scenario's), for readers.
    pub fn name_mms(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let b = text.as_bytes();
        let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
        let mut i = 0;
        while i < b.len() {
            if (i == 0 || !word(b[i - 1])) && b[i..].starts_with(b"mm") {
                let digits = b[i + 2..].iter().take_while(|c| c.is_ascii_digit()).count();
                let end = i + 2 + digits;
                if digits > 0 && (end == b.len() || !word(b[end])) {
                    if let Some(mm) = text[i + 2..end]
                        .parse::<usize>()
                        .ok()
                        .and_then(|n| self.mms.get(n))
                    {
                        out.push_str(&mm.name);
                        i = end;
                        continue;
                    }
                }
            }
            let ch = text[i..].chars().next().expect("in bounds");
            out.push(ch);
            i += ch.len_utf8();
        }
        out
    }
}

pub fn describe(m: &Machine, a: Action) -> String {
    match a {
        Action::Interrupt(_) => {
            return "take CALL_FUNCTION IPI (enter call_function_interrupt)".into()
        }
        Action::Nmi(_) => return format!("NMI: {}", step_text(m, a)),
        Action::Tick(_) => {
            return "timer interrupt: scheduler_tick drains LATR's saved flushes".into()
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
        Action::VcpuPut(_) | Action::VcpuIoctl(_) | Action::HostIrq(_) | Action::PleExit(_) => {
            return format!("host: {}", step_text(m, a));
        }
        Action::Step(_) => {}
    }
    let Action::Step(c) = a else { unreachable!() };
    let ctx = frame_context(m, c as usize);
    match step_text(m, a) {
        text if text.is_empty() => ctx,
        text => format!("{ctx}: {text}"),
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

    /// What the current step does, in kernel terms (kept only while replaying a
    /// counterexample); printed before what the functions it calls say. A later summary of the
    /// same step replaces an earlier one.
    #[inline]
    pub(crate) fn summary(&mut self, f: impl FnOnce() -> String) {
        if self.perf.labels_on {
            self.perf.summary = Some(f());
        }
    }
}

/// What a step says of itself: its summary, then what the functions it ran said (its labels),
/// each once; apply it to a copy of `m` with labels on.
fn step_text(m: &Machine, a: Action) -> String {
    let mut copy = m.clone();
    copy.perf.labels_on = true;
    copy.perf.labels.clear();
    copy.perf.summary = None;
    copy.apply(a, &mut NullEnv);
    joined(
        copy.perf.summary.take(),
        std::mem::take(&mut copy.perf.labels),
    )
}

/// A step's summary, then its labels, each once, joined by `; `.
fn joined(summary: Option<String>, labels: Vec<String>) -> String {
    let mut parts: Vec<String> = summary.into_iter().collect();
    for l in labels {
        if !parts.contains(&l) {
            parts.push(l);
        }
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_summary_and_the_labels_are_both_kept() {
        let s = |x: &str| x.to_string();
        assert_eq!(
            super::joined(
                Some(s("inc_mm_tlb_gen(mm1) = 2")),
                vec![s("trim"), s("trim")]
            ),
            "inc_mm_tlb_gen(mm1) = 2; trim"
        );
        assert_eq!(super::joined(None, vec![s("a"), s("b")]), "a; b");
        assert_eq!(super::joined(Some(s("exit")), vec![s("exit")]), "exit");
        assert_eq!(super::joined(None, vec![]), "");
    }
}
