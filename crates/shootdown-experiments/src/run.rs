//! Running points: build the machine for (row, variant), run the timed driver, turn the run into
//! the metric and counters. Points run in parallel (rayon) but each is a pure function of its
//! inputs, so results are identical whatever the thread count.

use crate::spec::{Experiment, Point};
use crate::ConfigError;
use rayon::prelude::*;
use serde::Serialize;
use shootdown_engine::profile::Profile;
use shootdown_engine::timed::{Limits, Stop, TimedDriver};
use shootdown_engine::trace::WindowStart;
use shootdown_engine::Time;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

/// The result of one point.
#[derive(Clone, Debug, Serialize)]
pub struct PointResult {
    pub index: usize,
    pub row: serde_json::Value,
    pub variant: String,
    pub rep: usize,
    pub value: f64,
    pub sim_ns: f64,
    pub steps: u64,
    pub wall_s: f64,
    pub stop: String,
    pub counters: BTreeMap<String, u64>,
    pub uses_checked: u64,
    pub violations: Vec<String>,
}

pub(crate) fn validate_workload(exp: &Experiment, w: &toml::Table) -> Result<(), ConfigError> {
    // Building validates every parameter; the machine is discarded. Workloads keep building
    // cheap enough for this (the largest maps a 3 GiB file's PTEs: ~0.1 s).
    let v = &exp.variants[0];
    shootdown_workloads::build(w, &exp.topology, exp.profile.clone(), v.options.clone())
        .map(|_| ())
        .map_err(|(k, r)| ConfigError::new(&exp.path, format!("workload.{k}"), r))
}

/// What a run records besides its result.
#[derive(Clone)]
enum Capture {
    Nothing,
    /// The timeline of a window of simulated time; the run stops at the window's end.
    Trace(WindowStart, Time),
    /// A flat profile of the measured window.
    Profile,
}

/// What a run recorded.
struct Captured {
    trace: Vec<shootdown_engine::trace::Stamped>,
    profile: Option<Profile>,
    events_measured: u64,
}

/// One run's profile: where its CPUs' time went while the metric was measured.
#[derive(Clone, Debug)]
pub struct PointProfile {
    pub point: PointResult,
    pub profile: Profile,
    /// Workload events in the profiled window (to normalise per event).
    pub events: u64,
}

fn run_one(
    exp: &Experiment,
    p: &Point,
    quick: bool,
    capture: Capture,
    max_time: Option<Time>,
) -> Result<(PointResult, Captured, Vec<String>), ConfigError> {
    let start = Instant::now();
    let w = exp.workload_table(quick, p.row_index)?;
    let variant = exp.variant(&p.variant).ok_or_else(|| {
        ConfigError::new(&exp.path, "variants", format!("no variant '{}'", p.variant))
    })?;
    let built = shootdown_workloads::build(
        &w,
        &exp.topology,
        exp.profile.clone(),
        variant.options.clone(),
    )
    .map_err(|(k, r)| ConfigError::new(&exp.path, format!("workload.{k}"), r))?;
    let mut m = built.machine;
    m.age_asid_rotors(p.seed);
    // The CPUs (or vCPUs), then the host's threads (the VMM's): every one an agent.
    let agents = shootdown_engine::Model::agents(&m);
    let mut driver = TimedDriver::new(agents, p.seed, 0);
    match &capture {
        Capture::Nothing => {}
        Capture::Trace(start, duration) => driver.enable_trace_window(start.clone(), *duration),
        Capture::Profile => driver.enable_profile(m.perf.measure_from),
    }
    let limit = max_time
        .map(|t| t.min(built.max_time))
        .unwrap_or(built.max_time);
    let stats = match &capture {
        Capture::Trace(_, duration) => run_to_window_end(&mut driver, &mut m, limit, *duration),
        _ => driver.run(
            &mut m,
            Limits {
                max_time: limit,
                max_steps: u64::MAX,
            },
        ),
    };
    let mut violations = Vec::new();
    let stop = match &stats.stop {
        Stop::Finished => "finished".to_string(),
        Stop::TimeLimit => "time_limit".to_string(),
        Stop::StepLimit => "step_limit".to_string(),
        Stop::Deadlock => {
            violations
                .push("deadlock: no CPU can run and the workload is not finished".to_string());
            if std::env::var_os("SHOOTDOWN_DUMP").is_some() {
                eprintln!("{}", m.dump());
            }
            "deadlock".to_string()
        }
        Stop::Violation(v) => {
            violations.push(v.to_string());
            "violation".to_string()
        }
    };
    let value = shootdown_workloads::metric(&m, &built.measure, &stats);
    let counters = m
        .counters()
        .named()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    let cpus = m.cpus.len();
    let names = (0..agents)
        .map(|a| match &m.host {
            Some(h) if a >= cpus => h.threads[a - cpus].name.clone(),
            _ => format!("cpu{a}"),
        })
        .collect();
    let r = PointResult {
        index: p.index,
        row: p.row.clone(),
        variant: p.variant.clone(),
        rep: p.rep,
        value,
        sim_ns: stats.end.as_ns_f64(),
        steps: stats.steps,
        wall_s: start.elapsed().as_secs_f64(),
        stop,
        counters,
        uses_checked: m.perf.uses_checked,
        violations,
    };
    let captured = Captured {
        trace: driver.take_trace_window(stats.end),
        profile: driver.take_profile(stats.end),
        events_measured: m.perf.events_measured,
    };
    Ok((r, captured, names))
}

/// Run one point.
pub fn run_point(exp: &Experiment, p: &Point, quick: bool) -> Result<PointResult, ConfigError> {
    run_one(exp, p, quick, Capture::Nothing, None).map(|(r, _, _)| r)
}

/// Run one point and profile it (see [`shootdown_engine::profile`]): the time of every CPU
/// from the start of the measurement to the end of the run, per kernel function.
pub fn profile_point(
    exp: &Experiment,
    p: &Point,
    quick: bool,
) -> Result<PointProfile, ConfigError> {
    let (point, c, _) = run_one(exp, p, quick, Capture::Profile, None)?;
    Ok(PointProfile {
        point,
        profile: c.profile.expect("profiling was enabled"),
        events: c.events_measured,
    })
}

/// [`profile_point`] for the points with these indices, on `threads` worker threads (0 = all
/// cores); in index order.
pub fn profile_points(
    exp: &Experiment,
    quick: bool,
    indices: &[usize],
    threads: usize,
) -> Result<Vec<PointProfile>, ConfigError> {
    on_points(exp, quick, indices, threads, profile_point)
}

/// Run the points with these indices on `threads` worker threads (0 = all cores); results come
/// back in index order.
pub fn run_points(
    exp: &Experiment,
    quick: bool,
    indices: &[usize],
    threads: usize,
) -> Result<Vec<PointResult>, ConfigError> {
    on_points(exp, quick, indices, threads, run_point)
}

/// `f` on the points with these indices, in parallel on `threads` worker threads (0 = all
/// cores); results in index order (a point's index is its position in the plan); the first
/// error wins.
fn on_points<T: Send>(
    exp: &Experiment,
    quick: bool,
    indices: &[usize],
    threads: usize,
    f: impl Fn(&Experiment, &Point, bool) -> Result<T, ConfigError> + Sync,
) -> Result<Vec<T>, ConfigError> {
    let points = exp.points(quick);
    if let Some(i) = indices.iter().find(|&&i| i >= points.len()) {
        return Err(ConfigError::new(
            &exp.path,
            "points",
            format!("no point {i} (the plan has {})", points.len()),
        ));
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| ConfigError::new(&exp.path, "", format!("thread pool: {e}")))?;
    let mut sorted = indices.to_vec();
    sorted.sort_unstable();
    let out: Vec<Result<T, ConfigError>> = pool.install(|| {
        sorted
            .par_iter()
            .map(|&i| f(exp, &points[i], quick))
            .collect()
    });
    out.into_iter().collect()
}

/// Run `m` until the trace window's end (or `limit`): in chunks of `duration` while the
/// window's start is not known yet (it waits for the first shootdown), then to its end.
fn run_to_window_end(
    driver: &mut TimedDriver,
    m: &mut shootdown_linux::Machine,
    limit: Time,
    duration: Time,
) -> shootdown_engine::timed::RunStats {
    let mut until = duration;
    let mut latest = Time::ZERO;
    loop {
        let end = driver.trace_window_end().unwrap_or(until).min(limit);
        let mut stats = driver.run(
            m,
            Limits {
                max_time: end,
                max_steps: u64::MAX,
            },
        );
        latest = latest.max(stats.end);
        let window_done = driver.trace_window_end().is_some_and(|e| end >= e);
        if !matches!(stats.stop, Stop::TimeLimit) || end >= limit || window_done {
            stats.end = latest;
            return stats;
        }
        if driver.trace_window_end().is_none() {
            until += duration;
        }
    }
}

/// Slices whose opening marks the interesting part of a run for a trace window with an
/// automatic start (besides any IPI leaving a CPU).
const TRACE_ANCHORS: &[&str] = &["kvm_flush_remote_tlbs"];

/// Where a trace window starts: at a given simulated time, or just before the workload's first
/// shootdown (its first IPI or `kvm_flush_remote_tlbs`), a tenth of the window ahead of it.
pub fn trace_window_start(from_ms: Option<f64>, duration_ms: f64) -> WindowStart {
    match from_ms {
        Some(ms) => WindowStart::At(Time::from_ns_f64(ms * 1e6)),
        None => WindowStart::First {
            anchors: TRACE_ANCHORS,
            lead: Time::from_ns_f64(duration_ms * 1e5),
        },
    }
}

/// Run one point with tracing on and write a Chrome/Perfetto trace JSON of `duration_ms` of
/// simulated time to `out`, starting at `from_ms` (or, when `None`, just before the first
/// shootdown: [`trace_window_start`]). The run stops at the window's end.
pub fn trace_point(
    exp: &Experiment,
    quick: bool,
    row_index: usize,
    variant: &str,
    from_ms: Option<f64>,
    duration_ms: f64,
    out: &Path,
) -> Result<PointResult, ConfigError> {
    let points = exp.points(quick);
    let p = points
        .iter()
        .find(|p| p.row_index == row_index && p.variant == variant && p.rep == 0)
        .ok_or_else(|| {
            ConfigError::new(
                &exp.path,
                "trace",
                format!("no point for row {row_index}, variant '{variant}'"),
            )
        })?;
    let (r, captured, names) = run_one(
        exp,
        p,
        quick,
        Capture::Trace(
            trace_window_start(from_ms, duration_ms),
            Time::from_ns_f64(duration_ms * 1e6),
        ),
        None,
    )?;
    let f = std::fs::File::create(out)
        .map_err(|e| ConfigError::new(out, "", format!("cannot write trace: {e}")))?;
    shootdown_engine::trace::write_chrome_trace(
        std::io::BufWriter::new(f),
        &captured.trace,
        &names,
        &exp.name,
    )
    .map_err(|e| ConfigError::new(out, "", format!("cannot write trace: {e}")))?;
    Ok(r)
}
