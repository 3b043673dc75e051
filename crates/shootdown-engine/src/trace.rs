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
