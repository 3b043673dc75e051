//! Running points: build the machine for (row, variant), run the timed driver, turn the run into
//! the metric and counters. Points run in parallel (rayon) but each is a pure function of its
//! inputs, so results are identical whatever the thread count.

use crate::spec::{Experiment, Point};
use crate::ConfigError;
use rayon::prelude::*;
use serde::Serialize;
use shootdown_engine::profile::Profile;
use shootdown_engine::timed::{Limits, Stop, TimedDriver};
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
#[derive(Clone, Copy)]
enum Capture {
    Nothing,
    /// The timeline (every trace event).
    Trace,
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
    match capture {
        Capture::Nothing => {}
        Capture::Trace => driver.enable_trace(),
        Capture::Profile => driver.enable_profile(m.perf.measure_from),
    }
    let limit = max_time
        .map(|t| t.min(built.max_time))
        .unwrap_or(built.max_time);
    let stats = driver.run(
        &mut m,
        Limits {
            max_time: limit,
            max_steps: u64::MAX,
        },
    );
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
        trace: driver.take_trace(),
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

/// Run one point with tracing on (at most `max_ms` of simulated time) and write a Chrome/Perfetto
/// trace JSON to `out`.
pub fn trace_point(
    exp: &Experiment,
    quick: bool,
    row_index: usize,
    variant: &str,
    max_ms: f64,
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
        Capture::Trace,
        Some(Time::from_ns_f64(max_ms * 1e6)),
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
