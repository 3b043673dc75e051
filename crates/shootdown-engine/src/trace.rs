//! Timelines in the Chrome trace-event JSON format, which Perfetto and chrome://tracing open:
//! one track ("thread") per agent, kernel functions as begin/end slices, IPIs as flow arrows.

use crate::model::AgentId;
use crate::time::Time;
use serde_json::{json, Value};
use std::io::Write;

/// What a step wants to show on the timeline.
#[derive(Clone, Debug)]
pub enum TraceEvent {
    /// A kernel function (or user work) starts on `agent`.
    Begin {
        agent: AgentId,
        name: &'static str,
        detail: Option<String>,
    },
    /// The innermost open slice on `agent` ends.
    End { agent: AgentId },
    /// A point event.
    Instant {
        agent: AgentId,
        name: &'static str,
        detail: Option<String>,
    },
    /// An IPI (or other message) leaves `agent`; `id` pairs it with its [`TraceEvent::FlowIn`].
    FlowOut {
        agent: AgentId,
        id: u64,
        name: &'static str,
    },
    /// The message `id` arrives at `agent`.
    FlowIn {
        agent: AgentId,
        id: u64,
        name: &'static str,
    },
}

/// A recorded event with its timestamp.
#[derive(Clone, Debug)]
pub struct Stamped {
    pub at: Time,
    pub ev: TraceEvent,
}

/// Serialise recorded events as Chrome trace JSON (`{"traceEvents": [...]}`), one track per
/// agent named by `agent_names`.
pub fn write_chrome_trace<W: Write>(
    out: W,
    events: &[Stamped],
    agent_names: &[String],
    process_name: &str,
) -> std::io::Result<()> {
    let mut list: Vec<Value> = Vec::with_capacity(events.len() + agent_names.len() + 1);
    list.push(json!({"ph": "M", "pid": 1, "name": "process_name", "args": {"name": process_name}}));
    for (i, n) in agent_names.iter().enumerate() {
        list.push(
            json!({"ph": "M", "pid": 1, "tid": i, "name": "thread_name", "args": {"name": n}}),
        );
        list.push(json!({"ph": "M", "pid": 1, "tid": i, "name": "thread_sort_index", "args": {"sort_index": i}}));
    }
    for s in events {
        let ts = s.at.0 as f64 / 1e6; // microseconds
        let v = match &s.ev {
            TraceEvent::Begin {
                agent,
                name,
                detail,
            } => {
                let mut v = json!({"ph": "B", "pid": 1, "tid": agent, "ts": ts, "name": name});
                if let Some(d) = detail {
                    v["args"] = json!({ "detail": d });
                }
                v
            }
            TraceEvent::End { agent } => json!({"ph": "E", "pid": 1, "tid": agent, "ts": ts}),
            TraceEvent::Instant {
                agent,
                name,
                detail,
            } => {
                let mut v =
                    json!({"ph": "i", "s": "t", "pid": 1, "tid": agent, "ts": ts, "name": name});
                if let Some(d) = detail {
                    v["args"] = json!({ "detail": d });
                }
                v
            }
            TraceEvent::FlowOut { agent, id, name } => {
                json!({"ph": "s", "pid": 1, "tid": agent, "ts": ts, "id": id, "name": name, "cat": "ipi"})
            }
            TraceEvent::FlowIn { agent, id, name } => {
                json!({"ph": "f", "bp": "e", "pid": 1, "tid": agent, "ts": ts, "id": id, "name": name, "cat": "ipi"})
            }
        };
        list.push(v);
    }
    serde_json::to_writer(
        out,
        &json!({ "traceEvents": list, "displayTimeUnit": "ns" }),
    )?;
    Ok(())
}

/// Where a trace window starts.
#[derive(Clone, Debug)]
pub enum WindowStart {
    /// At this simulated time.
    At(Time),
    /// `lead` before the first event that marks the interesting part: an IPI leaving a CPU
    /// ([`TraceEvent::FlowOut`]) or a slice named in `anchors` opening. With no such event,
    /// the window starts at zero.
    First {
        anchors: &'static [&'static str],
        lead: Time,
    },
}

/// A window of simulated time to keep from a run: the timeline a user opens in Perfetto.
///
/// Events before the window are not kept, but the slices they leave open are re-opened at the
/// window's start (so a handler that began before it still shows), every slice still open at
/// its end is closed there, and an IPI arrow whose send fell before the window is dropped
/// rather than left dangling.
#[derive(Debug)]
pub struct WindowSink {
    start: WindowStart,
    duration: Time,
    /// The window, once its start is known.
    from: Option<Time>,
    /// Per agent: slices open among the events before the window.
    open_before: Vec<Vec<(&'static str, Option<String>)>>,
    /// Auto start only, until the anchor is seen: the events of the last `lead`, and those of
    /// `[0, duration)` (the window if no anchor ever comes).
    recent: std::collections::VecDeque<Stamped>,
    head: Vec<Stamped>,
    /// The slices open before the window have been re-opened at its start.
    reopened: bool,
    kept: Vec<Stamped>,
    /// Per agent: slices opened in `kept` and not yet closed.
    depth: Vec<usize>,
    flows_out: std::collections::HashSet<u64>,
}

impl WindowSink {
    pub fn new(start: WindowStart, duration: Time) -> WindowSink {
        let from = match start {
            WindowStart::At(t) => Some(t),
            WindowStart::First { .. } => None,
        };
        WindowSink {
            start,
            duration,
            from,
            open_before: Vec::new(),
            recent: Default::default(),
            head: Vec::new(),
            reopened: false,
            kept: Vec::new(),
            depth: Vec::new(),
            flows_out: Default::default(),
        }
    }

    /// The window's start, once known.
    pub fn from(&self) -> Option<Time> {
        self.from
    }

    /// The window's end, once its start is known.
    pub fn end(&self) -> Option<Time> {
        self.from.map(|f| f + self.duration)
    }

    fn agent_slot<T: Default>(v: &mut Vec<T>, agent: AgentId) -> &mut T {
        if v.len() <= agent {
            v.resize_with(agent + 1, T::default);
        }
        &mut v[agent]
    }

    /// Account an event that falls before the window: only the slices it opens or closes.
    fn before(&mut self, s: Stamped) {
        match s.ev {
            TraceEvent::Begin {
                agent,
                name,
                detail,
            } => Self::agent_slot(&mut self.open_before, agent).push((name, detail)),
            TraceEvent::End { agent } => {
                Self::agent_slot(&mut self.open_before, agent).pop();
            }
            _ => {}
        }
    }

    /// Re-open, at the window's start, the slices open before it (once).
    fn reopen(&mut self) {
        if std::mem::replace(&mut self.reopened, true) {
            return;
        }
        let from = self.from.expect("window start known");
        for (agent, stack) in std::mem::take(&mut self.open_before)
            .into_iter()
            .enumerate()
        {
            for (name, detail) in stack {
                *Self::agent_slot(&mut self.depth, agent) += 1;
                self.kept.push(Stamped {
                    at: from,
                    ev: TraceEvent::Begin {
                        agent,
                        name,
                        detail,
                    },
                });
            }
        }
    }

    /// Keep an event inside the window.
    fn keep(&mut self, s: Stamped) {
        self.reopen();
        match &s.ev {
            TraceEvent::Begin { agent, .. } => *Self::agent_slot(&mut self.depth, *agent) += 1,
            TraceEvent::End { agent } => {
                let d = Self::agent_slot(&mut self.depth, *agent);
                if *d == 0 {
                    return; // closes a slice the window never saw open
                }
                *d -= 1;
            }
            TraceEvent::FlowOut { id, .. } => {
                self.flows_out.insert(*id);
            }
            TraceEvent::FlowIn { id, .. } => {
                if !self.flows_out.contains(id) {
                    return;
                }
            }
            TraceEvent::Instant { .. } => {}
        }
        self.kept.push(s);
    }

    fn is_anchor(&self, ev: &TraceEvent) -> bool {
        match (&self.start, ev) {
            (WindowStart::First { .. }, TraceEvent::FlowOut { .. }) => true,
            (WindowStart::First { anchors, .. }, TraceEvent::Begin { name, .. }) => {
                anchors.contains(name)
            }
            _ => false,
        }
    }

    /// Take one event as the run produces it.
    pub fn take(&mut self, at: Time, ev: TraceEvent) {
        let s = Stamped { at, ev };
        match self.from {
            Some(from) => {
                if at < from {
                    self.before(s);
                } else if at < from + self.duration {
                    self.keep(s);
                }
            }
            None => {
                let WindowStart::First { lead, .. } = self.start else {
                    unreachable!("a fixed window knows its start")
                };
                if self.is_anchor(&s.ev) {
                    let from = at.saturating_sub(lead);
                    self.from = Some(from);
                    self.head = Vec::new();
                    for r in std::mem::take(&mut self.recent) {
                        if r.at < from {
                            self.before(r);
                        } else {
                            self.keep(r);
                        }
                    }
                    self.keep(s);
                    return;
                }
                // Older than `lead` before now: can no longer fall in the window.
                while let Some(r) = self.recent.front() {
                    if r.at + lead >= at {
                        break;
                    }
                    let r = self.recent.pop_front().expect("front exists");
                    self.before(r);
                }
                if at < self.duration {
                    self.head.push(s.clone());
                }
                self.recent.push_back(s);
            }
        }
    }

    /// The window's events, every slice closed at `run_end` or the window's end, whichever
    /// comes first. With an auto start and no anchor seen, the window is `[0, duration)`.
    pub fn finish(mut self, run_end: Time) -> Vec<Stamped> {
        if self.from.is_none() {
            // No anchor: the window is the run's first `duration`, all of it in `head`.
            self.from = Some(Time::ZERO);
            self.open_before.clear();
            for s in std::mem::take(&mut self.head) {
                self.keep(s);
            }
        }
        self.reopen();
        let from = self.from.expect("start known");
        let end = (from + self.duration).min(run_end.max(from));
        for (agent, d) in std::mem::take(&mut self.depth).into_iter().enumerate() {
            for _ in 0..d {
                self.kept.push(Stamped {
                    at: end,
                    ev: TraceEvent::End { agent },
                });
            }
        }
        self.kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(agent: AgentId, name: &'static str) -> TraceEvent {
        TraceEvent::Begin {
            agent,
            name,
            detail: None,
        }
    }

    fn names(v: &[Stamped]) -> Vec<(u64, String)> {
        v.iter()
            .map(|s| {
                let what = match &s.ev {
                    TraceEvent::Begin { name, .. } => format!("B {name}"),
                    TraceEvent::End { agent } => format!("E {agent}"),
                    TraceEvent::Instant { name, .. } => format!("i {name}"),
                    TraceEvent::FlowOut { id, .. } => format!("s {id}"),
                    TraceEvent::FlowIn { id, .. } => format!("f {id}"),
                };
                (s.at.0, what)
            })
            .collect()
    }

    const ANCHORS: &[&str] = &["zap"];

    #[test]
    fn auto_window_starts_lead_before_the_first_ipi_and_closes_everything() {
        let mut w = WindowSink::new(
            WindowStart::First {
                anchors: ANCHORS,
                lead: Time(10),
            },
            Time(100),
        );
        w.take(Time(0), b(0, "task"));
        w.take(Time(5), b(1, "early")); // opened and closed before the window
        w.take(Time(6), TraceEvent::End { agent: 1 });
        w.take(Time(50), b(0, "flush"));
        w.take(
            Time(55),
            TraceEvent::FlowOut {
                agent: 0,
                id: 7,
                name: "ipi",
            },
        );
        w.take(
            Time(70),
            TraceEvent::FlowIn {
                agent: 1,
                id: 7,
                name: "ipi",
            },
        );
        w.take(
            Time(71),
            TraceEvent::FlowIn {
                agent: 1,
                id: 3,
                name: "ipi",
            },
        ); // sent before
        w.take(Time(80), b(1, "handler"));
        assert_eq!(w.end(), Some(Time(145)));
        w.take(Time(150), TraceEvent::End { agent: 1 }); // after the window: dropped
        let got = names(&w.finish(Time(150)));
        let want: Vec<(u64, String)> = [
            (45, "B task"),
            (50, "B flush"),
            (55, "s 7"),
            (70, "f 7"),
            (80, "B handler"),
            (145, "E 0"),
            (145, "E 0"),
            (145, "E 1"),
        ]
        .iter()
        .map(|(t, s)| (*t, s.to_string()))
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn an_anchor_slice_starts_the_window_and_no_anchor_means_the_first_duration() {
        let mut w = WindowSink::new(
            WindowStart::First {
                anchors: ANCHORS,
                lead: Time(0),
            },
            Time(20),
        );
        w.take(Time(3), b(0, "zap"));
        assert_eq!(w.from(), Some(Time(3)));

        let mut w = WindowSink::new(
            WindowStart::First {
                anchors: ANCHORS,
                lead: Time(5),
            },
            Time(20),
        );
        w.take(Time(1), b(0, "a"));
        w.take(Time(2), TraceEvent::End { agent: 0 });
        w.take(Time(30), b(0, "b"));
        assert_eq!(w.from(), None);
        let got = names(&w.finish(Time(40)));
        assert_eq!(
            got,
            vec![(1, "B a".to_string()), (2, "E 0".to_string())],
            "the window is [0, 20) when no shootdown happens"
        );
    }
}
