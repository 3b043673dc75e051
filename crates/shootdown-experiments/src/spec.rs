//! Experiment files: parsing, validation, and expansion into points.

use crate::{overrides, profile_dir_list, ConfigError};
use serde::Serialize;
use shootdown_engine::rng::mix_seed;
use shootdown_hw::{CostProfile, Topology};
use shootdown_linux::{OptValue, Options};
use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One variant (before/after/mainline) and its kernel options.
#[derive(Clone, Debug, Serialize)]
pub struct VariantSpec {
    pub name: String,
    pub label: String,
    /// The variant this one adds patches to (`builds_on`): tables compare the change against
    /// it as well as against the baseline.
    pub builds_on: Option<String>,
    #[serde(skip)]
    pub options: Options,
}

/// A published number to print beside the simulated one.
#[derive(Clone, Debug, Serialize)]
pub struct PublishedCell {
    pub row: serde_json::Value,
    pub variant: String,
    pub value: f64,
    pub stdev: Option<f64>,
    /// Cost keys of the profile fitted on this cell (it is then no prediction).
    pub fitted: Vec<String>,
    /// Published values of the experiment's reported counters (`counters = { NAME = N }`).
    pub counters: BTreeMap<String, f64>,
}

/// A run counter an experiment reports beside its metric, as the seed's tables do (seed 004's
/// "zap cnt"): `[[experiment.counters]] counter = "kvm.mtrr_zap_requests", label = "zap cnt"`.
#[derive(Clone, Debug, Serialize)]
pub struct CounterColumn {
    pub counter: String,
    pub label: String,
}

/// One run: (row, variant, repetition) with its seed.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    pub index: usize,
    pub row: serde_json::Value,
    #[serde(skip)]
    pub row_index: usize,
    pub variant: String,
    pub rep: usize,
    pub seed: u64,
}

/// A validated experiment.
#[derive(Clone, Debug)]
pub struct Experiment {
    pub path: PathBuf,
    pub name: String,
    pub seed_doc: Option<String>,
    pub title: String,
    pub profile: Arc<CostProfile>,
    pub metric: String,
    pub unit: String,
    pub repetitions: usize,
    pub quick_repetitions: usize,
    pub row_key: Option<String>,
    pub rows: Vec<toml::Value>,
    pub quick_rows: Vec<toml::Value>,
    pub higher_is_better: bool,
    pub rng_seed: u64,
    pub topology: Topology,
    /// `[host]`: the workload runs in VMs on this host (the topology is then the pCPUs).
    /// Validated; a row key naming a host setting varies it per row.
    pub host: Option<toml::Table>,
    pub workload: toml::Table,
    pub quick_workload: toml::Table,
    pub variants: Vec<VariantSpec>,
    pub published: Vec<PublishedCell>,
    /// Counters reported beside the metric.
    pub counters: Vec<CounterColumn>,
    /// How tables lay the experiment out: `"rows"` (a line per row, a column per variant: the
    /// default) or `"variants_as_rows"` (a line per variant, columns per row: seed 004).
    pub layout: String,
    /// Every file read to build this experiment (itself, then its profile chain).
    pub inputs: Vec<crate::Input>,
    /// The `--set KEY=VALUE` overrides applied, in order.
    pub sets: Vec<String>,
}

/// A `[host]` setting (a row key naming one varies it per row instead of a workload parameter).
fn is_host_key(k: &str) -> bool {
    shootdown_linux::host::HOST_KEYS
        .iter()
        .any(|(n, _)| *n == k)
}

pub(crate) fn to_json(v: &toml::Value) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}

/// A machine-independent 64-bit digest of a row value: its canonical TOML text (keys of inline
/// tables keep their file order) folded eight bytes at a time through [`mix_seed`].
fn value_seed(v: &toml::Value) -> u64 {
    let text = v.to_string();
    let bytes = text.as_bytes();
    bytes.chunks(8).fold(bytes.len() as u64, |h, chunk| {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        mix_seed(h, u64::from_le_bytes(word))
    })
}

fn check_keys(
    path: &Path,
    prefix: &str,
    t: &toml::Table,
    allowed: &[&str],
) -> Result<(), ConfigError> {
    for k in t.keys() {
        if !allowed.contains(&k.as_str()) {
            let full = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            return Err(ConfigError::new(
                path,
                full,
                format!("unknown key (expected one of: {})", allowed.join(", ")),
            ));
        }
    }
    Ok(())
}

fn table<'a>(path: &Path, doc: &'a toml::Table, key: &str) -> Result<&'a toml::Table, ConfigError> {
    match doc.get(key) {
        Some(toml::Value::Table(t)) => Ok(t),
        Some(_) => Err(ConfigError::new(path, key, "expected a table")),
        None => Err(ConfigError::new(path, key, "missing section")),
    }
}

fn string(path: &Path, t: &toml::Table, sect: &str, key: &str) -> Result<String, ConfigError> {
    match t.get(key) {
        Some(toml::Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(ConfigError::new(
            path,
            format!("{sect}.{key}"),
            "expected a string",
        )),
        None => Err(ConfigError::new(path, format!("{sect}.{key}"), "missing")),
    }
}

/// Repetitions of one point: far more than any table needs, few enough to finish.
const MAX_REPETITIONS: i64 = 1000;

fn uint(
    path: &Path,
    t: &toml::Table,
    sect: &str,
    key: &str,
    default: Option<i64>,
    range: RangeInclusive<i64>,
) -> Result<i64, ConfigError> {
    match t.get(key) {
        Some(toml::Value::Integer(i)) if range.contains(i) => Ok(*i),
        Some(toml::Value::Integer(i)) => Err(ConfigError::new(
            path,
            format!("{sect}.{key}"),
            format!(
                "must be between {} and {} (got {i})",
                range.start(),
                range.end()
            ),
        )),
        Some(_) => Err(ConfigError::new(
            path,
            format!("{sect}.{key}"),
            "expected an integer",
        )),
        None => default.ok_or_else(|| ConfigError::new(path, format!("{sect}.{key}"), "missing")),
    }
}

pub(crate) fn load_experiment(path: &Path, sets: &[String]) -> Result<Experiment, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(path, "", format!("cannot read experiment file: {e}")))?;
    let mut inputs = vec![crate::inputs::Input::new(path, &text)];
    let mut doc: toml::Table = toml::from_str(&text).map_err(|e| {
        ConfigError::new(path, "", format!("malformed TOML: {}", e.message().trim()))
    })?;
    overrides::apply(path, &mut doc, sets)?;
    check_keys(
        path,
        "",
        &doc,
        &[
            "experiment",
            "topology",
            "host",
            "workload",
            "quick",
            "variants",
            "published",
            "profile_override",
        ],
    )?;

    let e = table(path, &doc, "experiment")?;
    check_keys(
        path,
        "experiment",
        e,
        &[
            "name",
            "seed",
            "title",
            "profile",
            "metric",
            "unit",
            "repetitions",
            "quick_repetitions",
            "row_key",
            "rows",
            "quick_rows",
            "higher_is_better",
            "rng_seed",
            "counters",
            "layout",
        ],
    )?;
    let name = string(path, e, "experiment", "name")?;
    let layout = match e.get("layout") {
        None => "rows".to_string(),
        Some(toml::Value::String(l)) if l == "rows" || l == "variants_as_rows" => l.clone(),
        Some(_) => {
            return Err(ConfigError::new(
                path,
                "experiment.layout",
                "expected \"rows\" or \"variants_as_rows\"",
            ))
        }
    };
    let mut counters = Vec::new();
    if let Some(c) = e.get("counters") {
        let arr = c.as_array().ok_or_else(|| {
            ConfigError::new(path, "experiment.counters", "expected an array of tables")
        })?;
        for (i, c) in arr.iter().enumerate() {
            let sect = format!("experiment.counters[{i}]");
            let c = c
                .as_table()
                .ok_or_else(|| ConfigError::new(path, sect.as_str(), "expected a table"))?;
            check_keys(path, &sect, c, &["counter", "label"])?;
            let counter = string(path, c, &sect, "counter")?;
            if !shootdown_linux::COUNTER_NAMES.contains(&counter.as_str()) {
                return Err(ConfigError::new(
                    path,
                    format!("{sect}.counter"),
                    format!("unknown counter '{counter}'"),
                ));
            }
            let label = c
                .get("label")
                .and_then(|l| l.as_str())
                .unwrap_or(&counter)
                .to_string();
            counters.push(CounterColumn { counter, label });
        }
    }
    let seed_doc = match e.get("seed") {
        None => None,
        Some(toml::Value::String(s)) => Some(s.clone()),
        Some(_) => {
            return Err(ConfigError::new(
                path,
                "experiment.seed",
                "expected a seed id string like \"000\"",
            ))
        }
    };
    let title = e
        .get("title")
        .and_then(|v| v.as_str())
        .unwrap_or(&name)
        .to_string();
    let profile_name = string(path, e, "experiment", "profile")?;
    let metric = string(path, e, "experiment", "metric")?;
    let unit = string(path, e, "experiment", "unit")?;
    let repetitions = uint(
        path,
        e,
        "experiment",
        "repetitions",
        Some(1),
        1..=MAX_REPETITIONS,
    )? as usize;
    let quick_repetitions = uint(
        path,
        e,
        "experiment",
        "quick_repetitions",
        Some(repetitions.min(2) as i64),
        1..=MAX_REPETITIONS,
    )? as usize;
    let rng_seed = uint(path, e, "experiment", "rng_seed", Some(1), 0..=i64::MAX)? as u64;
    let row_key = match e.get("row_key") {
        None => None,
        Some(toml::Value::String(s)) => Some(s.clone()),
        Some(_) => {
            return Err(ConfigError::new(
                path,
                "experiment.row_key",
                "expected a workload key name",
            ))
        }
    };
    let rows = match e.get("rows") {
        Some(toml::Value::Array(a)) if !a.is_empty() => a.clone(),
        Some(_) => {
            return Err(ConfigError::new(
                path,
                "experiment.rows",
                "expected a non-empty array",
            ))
        }
        None => vec![toml::Value::String("-".into())],
    };
    let quick_rows = match e.get("quick_rows") {
        Some(toml::Value::Array(a)) if !a.is_empty() => a.clone(),
        Some(_) => {
            return Err(ConfigError::new(
                path,
                "experiment.quick_rows",
                "expected a non-empty array",
            ))
        }
        None => rows.clone(),
    };
    let higher_is_better = match e.get("higher_is_better") {
        None => true,
        Some(toml::Value::Boolean(b)) => *b,
        Some(_) => {
            return Err(ConfigError::new(
                path,
                "experiment.higher_is_better",
                "expected true or false",
            ))
        }
    };

    let t = table(path, &doc, "topology")?;
    check_keys(
        path,
        "topology",
        t,
        &[
            "sockets",
            "cores_per_socket",
            "threads_per_core",
            "cores_per_llc",
        ],
    )?;
    // Each value is an integer of at most MAX_CPUS here; Topology::new checks the minimums and
    // the product.
    let count = |key, default| {
        uint(
            path,
            t,
            "topology",
            key,
            default,
            0..=shootdown_hw::MAX_CPUS as i64,
        )
        .map(|n| n as usize)
    };
    // cores_per_llc: 0 (the default) is one last-level cache per socket.
    let per_llc = count("cores_per_llc", Some(0))?;
    let topology = Topology::new(
        count("sockets", None)?,
        count("cores_per_socket", None)?,
        count("threads_per_core", Some(1))?,
    )
    .and_then(|t| match per_llc {
        0 => Ok(t),
        n => t.with_cores_per_llc(n),
    })
    .map_err(|(k, r)| ConfigError::new(path, format!("topology.{k}"), r))?;

    let host = match doc.get("host") {
        None => None,
        Some(toml::Value::Table(h)) => {
            shootdown_workloads::host_config(h, topology.nr_cpus())
                .map_err(|(k, r)| ConfigError::new(path, format!("host.{k}"), r))?;
            Some(h.clone())
        }
        Some(_) => return Err(ConfigError::new(path, "host", "expected a table")),
    };
    if let (Some(h), Some(k)) = (&host, &row_key) {
        if is_host_key(k) {
            for quick in [false, true] {
                let rows_q = if quick { &quick_rows } else { &rows };
                for (i, r) in rows_q.iter().enumerate() {
                    let mut hh = h.clone();
                    hh.insert(k.clone(), r.clone());
                    shootdown_workloads::host_config(&hh, topology.nr_cpus()).map_err(
                        |(kk, reason)| {
                            ConfigError::new(
                                path,
                                format!(
                                    "experiment.{}[{i}]",
                                    if quick { "quick_rows" } else { "rows" }
                                ),
                                format!("host.{kk} = {r}: {reason}"),
                            )
                        },
                    )?;
                }
            }
        }
    }
    let workload = table(path, &doc, "workload")?.clone();
    let quick_workload = match doc.get("quick") {
        None => toml::Table::new(),
        Some(toml::Value::Table(q)) => {
            check_keys(path, "quick", q, &["workload"])?;
            match q.get("workload") {
                Some(toml::Value::Table(w)) => w.clone(),
                None => toml::Table::new(),
                Some(_) => {
                    return Err(ConfigError::new(path, "quick.workload", "expected a table"))
                }
            }
        }
        Some(_) => return Err(ConfigError::new(path, "quick", "expected a table")),
    };

    // A value the rows replace would be silently ignored; `experiment.rows` chooses it. A
    // `[host]` row key keeps its table value as the base the rows vary, so there only `--set`
    // of it is refused.
    if let Some(k) = &row_key {
        let per_row =
            format!("set per row (experiment.row_key = \"{k}\"); choose it with experiment.rows");
        if host.is_some() && is_host_key(k) {
            let key = format!("host.{k}");
            if sets
                .iter()
                .any(|s| s.split_once('=').is_some_and(|(sk, _)| sk.trim() == key))
            {
                return Err(ConfigError::new(path, key, format!("--set: {per_row}")));
            }
        } else {
            for (sect, t) in [("workload", &workload), ("quick.workload", &quick_workload)] {
                if t.contains_key(k) {
                    return Err(ConfigError::new(
                        path,
                        format!("{sect}.{k}"),
                        per_row.as_str(),
                    ));
                }
            }
        }
    }

    let vt = table(path, &doc, "variants")?;
    if vt.is_empty() {
        return Err(ConfigError::new(
            path,
            "variants",
            "at least one variant is needed",
        ));
    }
    let mut variants = Vec::new();
    for (vname, v) in vt {
        let sect = format!("variants.{vname}");
        let v = v
            .as_table()
            .ok_or_else(|| ConfigError::new(path, sect.as_str(), "expected a table"))?;
        check_keys(path, &sect, v, &["label", "options", "builds_on"])?;
        let builds_on = match v.get("builds_on") {
            None => None,
            Some(toml::Value::String(b)) if vt.contains_key(b) && b != vname => Some(b.clone()),
            Some(_) => {
                return Err(ConfigError::new(
                    path,
                    format!("{sect}.builds_on"),
                    "expected the name of another variant",
                ))
            }
        };
        let label = v
            .get("label")
            .and_then(|l| l.as_str())
            .unwrap_or(vname)
            .to_string();
        let mut options = Options::default();
        if let Some(o) = v.get("options") {
            let o = o.as_table().ok_or_else(|| {
                ConfigError::new(path, format!("{sect}.options"), "expected a table")
            })?;
            for (k, val) in o {
                let ov = match val {
                    toml::Value::String(s) => OptValue::Str(s.clone()),
                    toml::Value::Boolean(b) => OptValue::Bool(*b),
                    toml::Value::Integer(i) => OptValue::Int(*i),
                    other => {
                        return Err(ConfigError::new(
                            path,
                            format!("{sect}.options.{k}"),
                            format!("unsupported value {other}"),
                        ))
                    }
                };
                options
                    .set(k, &ov)
                    .map_err(|r| ConfigError::new(path, format!("{sect}.options.{k}"), r))?;
            }
        }
        variants.push(VariantSpec {
            name: vname.clone(),
            label,
            builds_on,
            options,
        });
    }
    // Variants keep the file's order (toml's preserve_order): the first is the baseline.
    let mut published = Vec::new();
    if let Some(p) = doc.get("published") {
        let arr = p.as_array().ok_or_else(|| {
            ConfigError::new(
                path,
                "published",
                "expected an array of tables ([[published]])",
            )
        })?;
        for (i, cell) in arr.iter().enumerate() {
            let sect = format!("published[{i}]");
            let c = cell
                .as_table()
                .ok_or_else(|| ConfigError::new(path, sect.as_str(), "expected a table"))?;
            check_keys(
                path,
                &sect,
                c,
                &["row", "variant", "value", "stdev", "counters"],
            )?;
            let row = c
                .get("row")
                .cloned()
                .ok_or_else(|| ConfigError::new(path, format!("{sect}.row"), "missing"))?;
            let variant = string(path, c, &sect, "variant")?;
            if !variants.iter().any(|v| v.name == variant) {
                return Err(ConfigError::new(
                    path,
                    format!("{sect}.variant"),
                    format!("no variant named '{variant}'"),
                ));
            }
            let num = |k: &str| -> Result<Option<f64>, ConfigError> {
                match c.get(k) {
                    None => Ok(None),
                    Some(toml::Value::Integer(i)) => Ok(Some(*i as f64)),
                    Some(toml::Value::Float(f)) => Ok(Some(*f)),
                    Some(_) => Err(ConfigError::new(
                        path,
                        format!("{sect}.{k}"),
                        "expected a number",
                    )),
                }
            };
            let value = num("value")?
                .ok_or_else(|| ConfigError::new(path, format!("{sect}.value"), "missing"))?;
            let mut pub_counters = BTreeMap::new();
            if let Some(pc) = c.get("counters") {
                let pc = pc.as_table().ok_or_else(|| {
                    ConfigError::new(path, format!("{sect}.counters"), "expected a table")
                })?;
                for (k, v) in pc {
                    if !counters.iter().any(|c: &CounterColumn| &c.counter == k) {
                        return Err(ConfigError::new(
                            path,
                            format!("{sect}.counters.{k}"),
                            "not one of experiment.counters",
                        ));
                    }
                    let n = match v {
                        toml::Value::Integer(i) => *i as f64,
                        toml::Value::Float(f) => *f,
                        _ => {
                            return Err(ConfigError::new(
                                path,
                                format!("{sect}.counters.{k}"),
                                "expected a number",
                            ))
                        }
                    };
                    pub_counters.insert(k.clone(), n);
                }
            }
            published.push(PublishedCell {
                row: to_json(&row),
                variant,
                value,
                stdev: num("stdev")?,
                fitted: Vec::new(),
                counters: pub_counters,
            });
        }
    }

    let dirs = profile_dir_list(path);
    let overlay = match doc.get("profile_override") {
        None => None,
        Some(toml::Value::Table(t)) => Some(t),
        Some(_) => {
            return Err(ConfigError::new(
                path,
                "profile_override",
                "expected a table with cost and/or features",
            ))
        }
    };
    let profile = Arc::new(crate::profile_file::load_profile_files(
        &profile_name,
        &dirs,
        path,
        overlay,
        &mut inputs,
    )?);
    mark_fitted(path, &name, &profile, &variants, &mut published)?;
    let exp = Experiment {
        path: path.to_path_buf(),
        name,
        seed_doc,
        title,
        profile,
        metric,
        unit,
        repetitions,
        quick_repetitions,
        row_key,
        rows,
        quick_rows,
        higher_is_better,
        rng_seed,
        topology,
        host,
        workload,
        quick_workload,
        variants,
        published,
        counters,
        layout,
        inputs,
        sets: sets.to_vec(),
    };
    // Validate the workload parameters of every row now, before anything runs.
    for quick in [false, true] {
        for r in 0..exp.rows_for(quick).len() {
            exp.workload_table(quick, r)
                .and_then(|w| crate::run::validate_workload(&exp, &w))?;
        }
    }
    Ok(exp)
}

/// Mark the published cells the profile fitted a cost on (`fitted = ["EXPERIMENT/VARIANT[/ROW]"]`
/// in the profile names this experiment).
fn mark_fitted(
    path: &Path,
    name: &str,
    profile: &CostProfile,
    variants: &[VariantSpec],
    published: &mut [PublishedCell],
) -> Result<(), ConfigError> {
    for (key, cells) in &profile.fitted {
        for c in cells {
            let parts: Vec<&str> = c.split('/').collect();
            if parts[0] != name {
                continue;
            }
            if !variants.iter().any(|v| v.name == parts[1]) {
                return Err(ConfigError::new(
                    path,
                    "profile",
                    format!(
                        "profile {}: cost.{key}.fitted names '{c}', but {name} has no variant '{}'",
                        profile.name, parts[1]
                    ),
                ));
            }
            for cell in published.iter_mut() {
                let row = match &cell.row {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                if cell.variant == parts[1] && (parts.len() < 3 || parts[2] == row) {
                    cell.fitted.push(key.clone());
                }
            }
        }
    }
    Ok(())
}

impl Experiment {
    pub fn rows_for(&self, quick: bool) -> &[toml::Value] {
        if quick {
            &self.quick_rows
        } else {
            &self.rows
        }
    }

    /// The `[workload]` table for a row (with `--quick` overrides and the row key applied).
    pub fn workload_table(
        &self,
        quick: bool,
        row_index: usize,
    ) -> Result<toml::Table, ConfigError> {
        let mut w = self.workload.clone();
        if quick {
            for (k, v) in &self.quick_workload {
                w.insert(k.clone(), v.clone());
            }
        }
        let row = self.rows_for(quick)[row_index].clone();
        if let Some(h) = &self.host {
            let mut h = h.clone();
            if let Some(k) = self.row_key.as_ref().filter(|k| is_host_key(k)) {
                h.insert(k.clone(), row.clone());
            }
            w.insert("host".into(), toml::Value::Table(h));
        }
        if let Some(k) = self
            .row_key
            .as_ref()
            .filter(|k| self.host.is_none() || !is_host_key(k))
        {
            w.insert(k.clone(), row);
        }
        Ok(w)
    }

    /// Every (row, variant, repetition) to run. Repetition `k` uses the same seed for every
    /// variant (common random numbers: the variants see the same random write offsets). The
    /// seed depends on the row's value, not its position in `rows`, so a row gives the same
    /// numbers in `--quick`, in the full list and alone (`--set 'experiment.rows=[48]'`).
    pub fn points(&self, quick: bool) -> Vec<Point> {
        let reps = if quick {
            self.quick_repetitions
        } else {
            self.repetitions
        };
        let mut v = Vec::new();
        for (ri, row) in self.rows_for(quick).iter().enumerate() {
            let row_seed = mix_seed(self.rng_seed, value_seed(row));
            for var in &self.variants {
                for rep in 0..reps {
                    v.push(Point {
                        index: v.len(),
                        row: to_json(row),
                        row_index: ri,
                        variant: var.name.clone(),
                        rep,
                        seed: mix_seed(row_seed, rep as u64),
                    });
                }
            }
        }
        v
    }

    pub fn variant(&self, name: &str) -> Option<&VariantSpec> {
        self.variants.iter().find(|v| v.name == name)
    }

    /// The plan the Python layer reads (see python/shootdown/api.py).
    pub fn plan_json(&self, quick: bool) -> serde_json::Value {
        serde_json::json!({
            "experiment": {
                "name": self.name,
                "seed": self.seed_doc,
                "title": self.title,
                "profile": self.profile.name,
                "metric": self.metric,
                "unit": self.unit,
                "row_key": self.row_key.clone().unwrap_or_default(),
                "higher_is_better": self.higher_is_better,
                "repetitions": if quick { self.quick_repetitions } else { self.repetitions },
                "path": self.path.display().to_string(),
                "rng_seed": self.rng_seed,
                "layout": self.layout,
                "counters": self.counters,
            },
            "variants": self.variants.iter().map(|v| serde_json::json!({"name": v.name, "label": v.label, "builds_on": v.builds_on})).collect::<Vec<_>>(),
            "rows": self.rows_for(quick).iter().map(to_json).collect::<Vec<_>>(),
            "published": self.published,
            "points": self.points(quick),
            "inputs": self.inputs,
            "sets": self.sets,
        })
    }
}
