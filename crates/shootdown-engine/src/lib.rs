//! # shootdown-engine
//!
//! The deterministic core every layer above builds on. Its centre is one narrow trait,
//! [`Model`]: a system of *agents* (CPUs, later vCPUs and host threads) that advance in atomic
//! steps. Two drivers run the very same steps:
//!
//! * the **timed driver** ([`timed::TimedDriver`]) — a discrete-event simulation in which each
//!   step charges time from a cost profile and a seeded RNG decides the rest;
//! * the **explorer** (in `shootdown-checker`) — which picks the next enabled action itself to
//!   cover every interleaving of a small configuration.
//!
//! A step talks to whichever driver runs it only through [`Env`]: it charges cost, asks for a
//! random number, schedules a wake-up, or emits a trace event. Under the explorer these are
//! no-ops or fixed choices, so a protocol's behaviour never depends on the driver.

pub mod clone;
pub mod digest;
pub mod hash;
pub mod intern;
pub mod model;
pub mod overrides;
pub mod phases;
pub mod profile;
mod queue;
pub mod rng;
pub mod shared;
pub mod time;
pub mod timed;
pub mod trace;
pub mod unhashed;

pub use digest::{digest, Components, HashCached};
pub use intern::Interner;
pub use model::{prefetch, Env, Lead, Model, Outcome, Park, StepKind, Violation};
pub use rng::DetRng;
pub use shared::Shared;
pub use time::Time;
pub use timed::PREFETCH_MIN_AGENTS;
pub use unhashed::Unhashed;
