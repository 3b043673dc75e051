//! `shootdown._native`: the thin PyO3 layer. Every function takes plain arguments, returns JSON
//! text (decoded by `python/shootdown/_bridge.py`), releases the GIL while the model runs, and
//! turns every user error into `ConfigError` (a `ValueError`) whose message is one line,
//! `FILE: KEY: REASON`.

// pyo3 0.22's create_exception! tests a feature this crate lacks.
#![allow(unexpected_cfgs)]
// pyo3 0.22's #[pyfunction] expansion converts PyErr into PyErr (PyO3#4828, fixed in 0.23.5).
#![allow(clippy::useless_conversion)]

use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::path::PathBuf;

/// The explorer clones and drops model states by the million, the timed driver's agents
/// allocate small frames; mimalloc's per-thread free lists make the explorer ~25 % faster than
/// glibc's malloc (docs/performance.md). Only Rust's own allocations go through it.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

create_exception!(
    _native,
    ConfigError,
    PyValueError,
    "A bad experiment, profile, scenario or option (FILE: KEY: REASON)."
);

create_exception!(
    _native,
    HostError,
    pyo3::exceptions::PyRuntimeError,
    "This machine cannot run a measurement (not Linux, one CPU, affinity refused…): one line."
);

fn cfg_err(e: impl std::fmt::Display) -> PyErr {
    ConfigError::new_err(e.to_string())
}

fn json(v: &impl serde::Serialize) -> PyResult<String> {
    serde_json::to_string(v).map_err(|e| cfg_err(format!("-: -: cannot encode result: {e}")))
}

/// Load the experiment at `path` with `sets` and run `f` on it, without the GIL.
fn on_experiment<T: Send>(
    py: Python<'_>,
    path: &std::path::Path,
    sets: &[String],
    f: impl FnOnce(&shootdown_experiments::Experiment) -> Result<T, shootdown_experiments::ConfigError>
        + Send,
) -> PyResult<T> {
    py.allow_threads(|| f(&shootdown_experiments::load(path, sets)?))
        .map_err(cfg_err)
}

/// Expand an experiment file into its plan: experiment metadata, variants, rows, published
/// numbers and the points to run.
#[pyfunction]
fn plan(py: Python<'_>, path: PathBuf, sets: Vec<String>, quick: bool) -> PyResult<String> {
    let plan = on_experiment(py, &path, &sets, |exp| Ok(exp.plan_json(quick)))?;
    json(&plan)
}

/// Run the points with these indices (in parallel on `threads` threads; 0 = all cores).
#[pyfunction]
fn run_points(
    py: Python<'_>,
    path: PathBuf,
    sets: Vec<String>,
    quick: bool,
    indices: Vec<usize>,
    threads: usize,
) -> PyResult<String> {
    let res = on_experiment(py, &path, &sets, |exp| {
        shootdown_experiments::run_points(exp, quick, &indices, threads)
    })?;
    json(&res)
}

/// Profile the points with these indices: per run, the CPU time of every kernel function in the
/// measured window (see `shootdown_engine::profile`).
#[pyfunction]
fn profile_points(
    py: Python<'_>,
    path: PathBuf,
    sets: Vec<String>,
    quick: bool,
    indices: Vec<usize>,
    threads: usize,
) -> PyResult<String> {
    let res = on_experiment(py, &path, &sets, |exp| {
        shootdown_experiments::profile_points(exp, quick, &indices, threads)
    })?;
    let ns = |t: shootdown_engine::Time| t.as_ns_f64();
    let out: Vec<serde_json::Value> = res
        .iter()
        .map(|r| {
            let functions: Vec<serde_json::Value> = r
                .profile
                .functions
                .iter()
                .map(|(name, f)| {
                    serde_json::json!({
                        "function": name,
                        "calls": f.calls,
                        "exclusive_ns": ns(f.exclusive),
                        "inclusive_ns": ns(f.inclusive),
                    })
                })
                .collect();
            serde_json::json!({
                "index": r.point.index,
                "row": r.point.row,
                "variant": r.point.variant,
                "rep": r.point.rep,
                "value": r.point.value,
                "events": r.events,
                "total_ns": ns(r.profile.total),
                "outside_ns": ns(r.profile.outside),
                "functions": functions,
            })
        })
        .collect();
    json(&out)
}

/// Run one point with tracing and write a Chrome/Perfetto trace JSON of `max_ms` of simulated
/// time to `out_path`, from `from_ms` (None: just before the workload's first shootdown).
#[pyfunction]
#[pyo3(signature = (path, sets, quick, row_index, variant, out_path, max_ms=2.0, from_ms=None))]
#[allow(clippy::too_many_arguments)] // the signature is the Python API
fn trace(
    py: Python<'_>,
    path: PathBuf,
    sets: Vec<String>,
    quick: bool,
    row_index: usize,
    variant: String,
    out_path: PathBuf,
    max_ms: f64,
    from_ms: Option<f64>,
) -> PyResult<String> {
    let r = on_experiment(py, &path, &sets, |exp| {
        shootdown_experiments::trace_point(
            exp, quick, row_index, &variant, from_ms, max_ms, &out_path,
        )
    })?;
    json(&r)
}

/// Time one run of the first point: steps/s and simulated seconds per wall second.
#[pyfunction]
#[pyo3(name = "bench")]
fn bench_run(py: Python<'_>, path: PathBuf, sets: Vec<String>, quick: bool) -> PyResult<String> {
    let r = on_experiment(py, &path, &sets, |exp| {
        let p = exp
            .points(quick)
            .into_iter()
            .next()
            .expect("an experiment has at least one point");
        shootdown_experiments::run_point(exp, &p, quick)
    })?;
    let v = serde_json::json!({
        "steps": r.steps,
        "wall_s": r.wall_s,
        "sim_ns": r.sim_ns,
        "steps_per_s": r.steps as f64 / r.wall_s.max(1e-9),
        "sim_s_per_wall_s": r.sim_ns / 1e9 / r.wall_s.max(1e-9),
        "row": r.row,
        "variant": r.variant,
    });
    json(&v)
}

/// Explore (or sample) a checker scenario.
#[pyfunction]
#[pyo3(signature = (scenario, mutant, memory_model, max_states, sample, seed, strategy, symmetry=true, sets=Vec::new()))]
#[allow(clippy::too_many_arguments)] // the signature is the Python API
fn check(
    py: Python<'_>,
    scenario: PathBuf,
    mutant: Option<String>,
    memory_model: String,
    max_states: Option<u64>,
    sample: Option<u64>,
    seed: u64,
    strategy: String,
    symmetry: bool,
    sets: Vec<String>,
) -> PyResult<String> {
    // Ctrl-C (or SIGTERM) stops the search within a poll: the result is then verdict
    // "interrupted", with the states explored so far (the signal itself is consumed).
    shootdown_checker::clear_cancel();
    let (r, _signal) = interruptible(
        py,
        || {
            shootdown_checker::check(
                &scenario,
                mutant.as_deref(),
                &memory_model,
                max_states,
                sample,
                seed,
                &strategy,
                symmetry,
                &sets,
            )
        },
        shootdown_checker::request_cancel,
    );
    json(&r.map_err(cfg_err)?)
}

/// Show (or not) a live progress line on stderr while `check` explores (display only).
#[pyfunction]
fn set_check_progress(on: bool) {
    shootdown_checker::set_progress(on);
}

/// The scenarios in a directory with their mutants.
#[pyfunction]
fn check_list(py: Python<'_>, scenarios_dir: PathBuf) -> PyResult<String> {
    let r = py
        .allow_threads(|| shootdown_checker::list(&scenarios_dir))
        .map_err(cfg_err)?;
    json(&r)
}

/// `shootdown_hostbench::probe()`: this machine's description, as JSON.
#[pyfunction]
fn host_probe(py: Python<'_>) -> PyResult<String> {
    let info = py
        .allow_threads(shootdown_hostbench::probe)
        .map_err(|e| HostError::new_err(e.to_string()))?;
    json(&info)
}

/// Run `work` on a thread of its own while this one, holding the GIL only briefly, checks for
/// signals every 50 ms (Python's SIGINT handler, and whatever the CLI installed for SIGTERM).
/// On a signal it calls `cancel` once and keeps waiting for `work`, which must then return
/// soon; the result comes back with the signal's error (`KeyboardInterrupt`), if any.
fn interruptible<T: Send>(
    py: Python<'_>,
    work: impl FnOnce() -> T + Send,
    cancel: impl Fn(),
) -> (T, Option<PyErr>) {
    std::thread::scope(|scope| {
        let worker = scope.spawn(work);
        let mut signal = None;
        while !worker.is_finished() {
            py.allow_threads(|| std::thread::sleep(std::time::Duration::from_millis(50)));
            if signal.is_none() {
                if let Err(e) = py.check_signals() {
                    cancel();
                    signal = Some(e);
                }
            }
        }
        let value = match worker.join() {
            Ok(v) => v,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        (value, signal)
    })
}

/// `shootdown_hostbench::run_case()` on a JSON case spec, as JSON. Ctrl-C cancels the case
/// (its threads and mappings are cleaned up) and raises `KeyboardInterrupt` here.
#[pyfunction]
fn host_run_case(py: Python<'_>, spec: &str) -> PyResult<String> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let spec = shootdown_hostbench::CaseSpec::from_json(spec)
        .map_err(|e| HostError::new_err(e.to_string()))?;
    let cancel = AtomicBool::new(false);
    let (result, signal) = interruptible(
        py,
        || shootdown_hostbench::run_case(&spec, &cancel),
        || cancel.store(true, Ordering::SeqCst),
    );
    if let Some(interrupt) = signal {
        return Err(interrupt);
    }
    json(&result.map_err(|e| HostError::new_err(e.to_string()))?)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("ConfigError", m.py().get_type_bound::<ConfigError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    m.add_function(wrap_pyfunction!(run_points, m)?)?;
    m.add_function(wrap_pyfunction!(trace, m)?)?;
    m.add_function(wrap_pyfunction!(profile_points, m)?)?;
    m.add_function(wrap_pyfunction!(bench_run, m)?)?;
    m.add_function(wrap_pyfunction!(check, m)?)?;
    m.add_function(wrap_pyfunction!(set_check_progress, m)?)?;
    m.add_function(wrap_pyfunction!(check_list, m)?)?;
    m.add("HostError", m.py().get_type_bound::<HostError>())?;
    m.add_function(wrap_pyfunction!(host_probe, m)?)?;
    m.add_function(wrap_pyfunction!(host_run_case, m)?)?;
    Ok(())
}
