//! Where simulated CPU time goes: a flat profile built from the same begin/end events the
//! timeline shows, aggregated as they arrive instead of stored (a 48-CPU run emits millions).
//!
//! Each agent's time between two of its events belongs to the innermost slice open on it then
//! (its *exclusive* time), and to every open slice (*inclusive* time, counted once per name when
//! a function is on the stack twice, e.g. an IPI handler interrupting a flush that itself waits
//! in `smp_call_function_many_cond`). Time with no slice open is user work or idle. Only time
//! after `from` counts, so a warm-up can be left out the way the metric leaves it out; a slice
//! that began earlier is cut at `from`.

use crate::model::AgentId;
use crate::time::Time;
use crate::trace::TraceEvent;
use std::collections::BTreeMap;

/// Totals of one function (slice name).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FunctionTime {
    /// Slices that began at or after `from`.
    pub calls: u64,
    /// Time with this function innermost.
    pub exclusive: Time,
    /// Time with this function anywhere on the stack.
    pub inclusive: Time,
}

/// The profile of one run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Profile {
    /// Per function name, in name order (deterministic).
    pub functions: BTreeMap<&'static str, FunctionTime>,
    /// Agent time with no slice open (user work, idle), after `from`.
    pub outside: Time,
    /// Agent time covered: agents × (end − from).
    pub total: Time,
}

/// Builds a [`Profile`] from a stream of stamped trace events.
#[derive(Clone, Debug)]
pub struct Profiler {
    from: Time,
    stacks: Vec<Vec<&'static str>>,
    last: Vec<Time>,
    profile: Profile,
}

impl Profiler {
    /// A profiler for `agents` agents counting time after `from`.
    pub fn new(agents: usize, from: Time) -> Self {
        Profiler {
            from,
            stacks: vec![Vec::new(); agents],
            last: vec![Time::ZERO; agents],
            profile: Profile::default(),
        }
    }

    /// Account `agent`'s time up to `at` to what is open on it.
    fn advance(&mut self, agent: AgentId, at: Time) {
        let start = self.last[agent].max(self.from);
        self.last[agent] = self.last[agent].max(at);
        if at <= start {
            return;
        }
        let dt = at - start;
        let stack = &self.stacks[agent];
        let Some(&top) = stack.last() else {
            self.profile.outside += dt;
            return;
        };
        let p = &mut self.profile;
        p.functions.entry(top).or_default().exclusive += dt;
        for (i, &name) in stack.iter().enumerate() {
            // Inclusive once per name: only its outermost occurrence counts.
            if !stack[..i].contains(&name) {
                p.functions.entry(name).or_default().inclusive += dt;
            }
        }
    }

    /// Take one event stamped `at`.
    pub fn record(&mut self, at: Time, ev: &TraceEvent) {
        match ev {
            TraceEvent::Begin { agent, name, .. } => {
                self.advance(*agent, at);
                if at >= self.from {
                    self.profile.functions.entry(name).or_default().calls += 1;
                }
                self.stacks[*agent].push(name);
            }
            TraceEvent::End { agent } => {
                self.advance(*agent, at);
                self.stacks[*agent].pop();
            }
            TraceEvent::Instant { .. } | TraceEvent::FlowOut { .. } | TraceEvent::FlowIn { .. } => {
            }
        }
    }

    /// Close the run at `end` (slices still open are cut there) and return the profile.
    pub fn finish(mut self, end: Time) -> Profile {
        for a in 0..self.stacks.len() {
            self.advance(a, end);
        }
        let agents = self.stacks.len() as u64;
        self.profile.total = Time(end.saturating_sub(self.from).0 * agents);
        self.profile
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn begin(agent: AgentId, name: &'static str) -> TraceEvent {
        TraceEvent::Begin {
            agent,
            name,
            detail: None,
        }
    }

    #[test]
    fn exclusive_goes_to_the_innermost_and_inclusive_to_every_open_slice() {
        let mut p = Profiler::new(2, Time::ZERO);
        p.record(Time(10), &begin(0, "flush"));
        p.record(Time(30), &begin(0, "smp_call"));
        p.record(Time(50), &begin(0, "irq")); // an interrupt while waiting
        p.record(Time(55), &TraceEvent::End { agent: 0 });
        p.record(Time(90), &TraceEvent::End { agent: 0 });
        p.record(Time(100), &TraceEvent::End { agent: 0 });
        let r = p.finish(Time(120));
        let f = |n| r.functions[n];
        assert_eq!(f("flush").exclusive, Time(30)); // 10..30 and 90..100
        assert_eq!(f("flush").inclusive, Time(90));
        assert_eq!(f("smp_call").exclusive, Time(55)); // 30..50 and 55..90
        assert_eq!(f("irq").exclusive, Time(5));
        assert_eq!(f("irq").calls, 1);
        // Agent 0: 0..10 and 100..120 outside; agent 1: all 120.
        assert_eq!(r.outside, Time(150));
        assert_eq!(r.total, Time(240));
        let covered: u64 = r.functions.values().map(|t| t.exclusive.0).sum();
        assert_eq!(covered + r.outside.0, r.total.0);
    }

    #[test]
    fn a_recursive_name_counts_inclusive_time_once() {
        let mut p = Profiler::new(1, Time::ZERO);
        p.record(Time(0), &begin(0, "flush_tlb_func"));
        p.record(Time(10), &begin(0, "flush_tlb_func"));
        p.record(Time(20), &TraceEvent::End { agent: 0 });
        p.record(Time(30), &TraceEvent::End { agent: 0 });
        let r = p.finish(Time(30));
        assert_eq!(r.functions["flush_tlb_func"].inclusive, Time(30));
        assert_eq!(r.functions["flush_tlb_func"].exclusive, Time(30));
        assert_eq!(r.functions["flush_tlb_func"].calls, 2);
    }

    #[test]
    fn time_before_from_is_left_out_and_open_slices_are_cut() {
        let mut p = Profiler::new(1, Time(100));
        p.record(Time(50), &begin(0, "early")); // began before `from`: no call counted
        p.record(Time(150), &TraceEvent::End { agent: 0 });
        p.record(Time(160), &begin(0, "late"));
        let r = p.finish(Time(200));
        assert_eq!(r.functions["early"].calls, 0);
        assert_eq!(r.functions["early"].exclusive, Time(50));
        assert_eq!(r.functions["late"].exclusive, Time(40));
        assert_eq!(r.outside, Time(10));
        assert_eq!(r.total, Time(100));
    }
}
