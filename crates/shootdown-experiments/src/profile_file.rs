//! Profile files (`profiles/<name>.toml`): `[profile]` (name, description, inherits),
//! `[features]` and `[cost]` (each cost a number of ns or `{ value, source, fitted }`, where
//! `fitted` lists the published cells the value was fitted on, as `EXPERIMENT/VARIANT` or
//! `EXPERIMENT/VARIANT/ROW`; the reproduction tables mark those cells). A profile may
//! inherit another and override any subset; the result must define every cost key. An
//! optional `[machine]` table describes the machine the costs were measured on
//! ([`MACHINE_KEYS`]; `shootdown calibrate` writes it).
//!
//! An experiment may add one more layer on top, its `[profile_override]` table (`cost` and
//! `features` subtables, same syntax), for sensitivity studies such as
//! `--set profile_override.cost.ipi_latency_same_socket=600`. The resulting profile's name lists
//! the overridden keys, so every output shows that it is not the machine's profile.

use crate::inputs::Input;
use crate::ConfigError;
use shootdown_hw::profile::Costs;
use shootdown_hw::{CostProfile, Features};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn find(name: &str, dirs: &[PathBuf], from: &Path) -> Result<PathBuf, ConfigError> {
    if name.is_empty() || name.contains('/') || name.contains("..") {
        return Err(ConfigError::new(
            from,
            "experiment.profile",
            format!("invalid profile name '{name}'"),
        ));
    }
    for d in dirs {
        let p = d.join(format!("{name}.toml"));
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(ConfigError::new(from, "experiment.profile", format!("no profile '{name}' (looked for {name}.toml in $SHOOTDOWN_PROFILES, in profiles/ next to the experiment and its parents, and in the installed package's profiles)")))
}

fn read_toml(path: &Path, inputs: &mut Vec<Input>) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(path, "", format!("cannot read: {e}")))?;
    inputs.push(Input::new(path, &text));
    toml::from_str(&text)
        .map_err(|e| ConfigError::new(path, "", format!("malformed TOML: {}", e.message())))
}

/// The keys of a profile's optional `[machine]` table and the TOML type each takes. The table
/// describes the machine the costs were measured on (`shootdown calibrate` writes it; the model
/// does not read it: an experiment still says its own `[topology]` and `[host]`); `shootdown
/// validate` builds its simulated twin of the machine from it.
pub const MACHINE_KEYS: &[(&str, &str)] = &[
    ("cpu_model", "string"),
    ("kernel", "string"),
    ("measured_at", "string"),
    ("sockets", "integer"),
    ("cores_per_socket", "integer"),
    ("threads_per_core", "integer"),
    ("online_cpus", "integer"),
    ("hypervisor", "string"),
    ("pv_tlb_flush", "boolean"),
    ("pv_send_ipi", "boolean"),
    ("pv_sched_yield", "boolean"),
    ("pv_unhalt", "boolean"),
    ("idle_poll", "boolean"),
];

fn check_machine(path: &Path, m: &toml::Value) -> Result<(), ConfigError> {
    let toml::Value::Table(m) = m else {
        return Err(ConfigError::new(path, "machine", "expected a table"));
    };
    for (k, v) in m {
        let Some((_, ty)) = MACHINE_KEYS.iter().find(|(name, _)| name == k) else {
            let known: Vec<&str> = MACHINE_KEYS.iter().map(|(n, _)| *n).collect();
            return Err(ConfigError::new(
                path,
                format!("machine.{k}"),
                format!("unknown key (known: {})", known.join(", ")),
            ));
        };
        let ok = match *ty {
            "string" => v.is_str(),
            "boolean" => v.is_bool(),
            _ => v.as_integer().is_some_and(|i| (1..=16384).contains(&i)),
        };
        if !ok {
            let want = if *ty == "integer" {
                "an integer in 1..=16384"
            } else {
                ty
            };
            return Err(ConfigError::new(
                path,
                format!("machine.{k}"),
                format!("expected {want}, got {}", v.type_str()),
            ));
        }
    }
    Ok(())
}

/// Load a profile by name, following `inherits`; then apply `overlay` (an experiment's
/// `[profile_override]` table, `from` being that experiment) last.
pub fn load_profile(
    name: &str,
    dirs: &[PathBuf],
    from: &Path,
    overlay: Option<&toml::Table>,
) -> Result<CostProfile, ConfigError> {
    load_profile_files(name, dirs, from, overlay, &mut Vec::new())
}

/// [`load_profile`], also appending every profile file it read to `inputs` (most derived first).
pub(crate) fn load_profile_files(
    name: &str,
    dirs: &[PathBuf],
    from: &Path,
    overlay: Option<&toml::Table>,
    inputs: &mut Vec<Input>,
) -> Result<CostProfile, ConfigError> {
    let mut chain = Vec::new();
    let mut cur = name.to_string();
    let mut files = Vec::new();
    loop {
        if chain.contains(&cur) {
            return Err(ConfigError::new(
                from,
                "profile.inherits",
                format!("inheritance cycle: {} -> {cur}", chain.join(" -> ")),
            ));
        }
        let path = find(&cur, dirs, from)?;
        let t = read_toml(&path, inputs)?;
        chain.push(cur.clone());
        for k in t.keys() {
            if !["profile", "features", "cost", "machine"].contains(&k.as_str()) {
                return Err(ConfigError::new(
                    &path,
                    k.as_str(),
                    "unknown section (expected profile, features, cost, machine)",
                ));
            }
        }
        if let Some(m) = t.get("machine") {
            check_machine(&path, m)?;
        }
        let parent = match t.get("profile").and_then(|p| p.get("inherits")) {
            Some(toml::Value::String(s)) => Some(s.clone()),
            Some(_) => {
                return Err(ConfigError::new(
                    &path,
                    "profile.inherits",
                    "expected a profile name",
                ))
            }
            None => None,
        };
        if let Some(toml::Value::Table(p)) = t.get("profile") {
            for k in p.keys() {
                if !["name", "description", "inherits"].contains(&k.as_str()) {
                    return Err(ConfigError::new(
                        &path,
                        format!("profile.{k}"),
                        "unknown key (expected name, description, inherits)",
                    ));
                }
            }
        }
        files.push((path, t));
        match parent {
            Some(p) => cur = p,
            None => break,
        }
    }
    let mut shown_name = name.to_string();
    if let Some(o) = overlay {
        let mut keys = Vec::new();
        for (k, v) in o {
            if k != "features" && k != "cost" {
                return Err(ConfigError::new(
                    from,
                    format!("profile_override.{k}"),
                    "unknown section (expected cost, features)",
                ));
            }
            let t = v.as_table().ok_or_else(|| {
                ConfigError::new(from, format!("profile_override.{k}"), "expected a table")
            })?;
            keys.extend(t.keys().map(|n| format!("{k}.{n}")));
        }
        if !keys.is_empty() {
            shown_name = format!("{name} + override({})", keys.join(", "));
        }
        // The experiment file is the most derived layer; errors name it and the full key.
        let mut layer = o.clone();
        for sect in ["features", "cost"] {
            if let Some(toml::Value::Table(t)) = layer.remove(sect) {
                layer.insert(sect.into(), toml::Value::Table(t));
            }
        }
        files.insert(0, (from.to_path_buf(), layer));
    }
    // A key missing everywhere is the most derived profile file's to define.
    let top = files
        .iter()
        .map(|(p, _)| p.clone())
        .find(|p| overlay.is_none() || p != from)
        .expect("at least one profile file");
    // Where an error points: a profile file's own key, or the experiment's override key.
    let key_in = |p: &Path, key: String| -> String {
        if overlay.is_some() && p == from {
            format!("profile_override.{key}")
        } else {
            key
        }
    };
    // Apply from the root ancestor down.
    let mut feats: BTreeMap<String, (toml::Value, PathBuf)> = BTreeMap::new();
    let mut costs: BTreeMap<String, f64> = BTreeMap::new();
    let mut cost_src: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut fitted: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (path, t) in files.iter().rev() {
        if let Some(f) = t.get("features") {
            let f = f.as_table().ok_or_else(|| {
                ConfigError::new(path, key_in(path, "features".into()), "expected a table")
            })?;
            for (k, v) in f {
                feats.insert(k.clone(), (v.clone(), path.clone()));
            }
        }
        if let Some(c) = t.get("cost") {
            let c = c.as_table().ok_or_else(|| {
                ConfigError::new(path, key_in(path, "cost".into()), "expected a table")
            })?;
            for (k, v) in c {
                let key = format!("cost.{k}");
                // A value set again (here or by an inheriting profile) is no longer the fitted one.
                fitted.remove(k);
                let n = match v {
                    toml::Value::Integer(i) => *i as f64,
                    toml::Value::Float(f) => *f,
                    toml::Value::Table(t) => {
                        for tk in t.keys() {
                            if !["value", "source", "fitted"].contains(&tk.as_str()) {
                                return Err(ConfigError::new(
                                    path,
                                    key_in(path, format!("{key}.{tk}")),
                                    "unknown key (expected value, source, fitted)",
                                ));
                            }
                        }
                        if let Some(f) = t.get("fitted") {
                            let cells = f
                                .as_array()
                                .map(|a| {
                                    a.iter()
                                        .map(|c| c.as_str().map(str::to_string))
                                        .collect::<Option<Vec<_>>>()
                                })
                                .unwrap_or(None)
                                .filter(|c| {
                                    c.iter().all(|x| (2..=3).contains(&x.split('/').count()))
                                });
                            let Some(cells) = cells else {
                                return Err(ConfigError::new(
                                    path,
                                    key_in(path, format!("{key}.fitted")),
                                    "expected a list of \"EXPERIMENT/VARIANT\" or \"EXPERIMENT/VARIANT/ROW\" strings",
                                ));
                            };
                            fitted.insert(k.clone(), cells);
                        }
                        match t.get("value") {
                            Some(toml::Value::Integer(i)) => *i as f64,
                            Some(toml::Value::Float(f)) => *f,
                            _ => {
                                return Err(ConfigError::new(
                                    path,
                                    key_in(path, format!("{key}.value")),
                                    "expected a number of nanoseconds",
                                ))
                            }
                        }
                    }
                    _ => {
                        return Err(ConfigError::new(
                            path,
                            key_in(path, key),
                            "expected a number of ns or { value, source }",
                        ))
                    }
                };
                costs.insert(k.clone(), n);
                cost_src.insert(k.clone(), path.clone());
            }
        }
    }
    let costs = Costs::from_ns_map(&costs).map_err(|(k, reason)| {
        let file = cost_src.get(&k).cloned().unwrap_or_else(|| top.clone());
        ConfigError::new(&file, key_in(&file, format!("cost.{k}")), reason)
    })?;
    let get_bool = |k: &str| -> Result<bool, ConfigError> {
        match feats.get(k) {
            Some((toml::Value::Boolean(b), _)) => Ok(*b),
            Some((_, p)) => Err(ConfigError::new(
                p,
                key_in(p, format!("features.{k}")),
                "expected true or false",
            )),
            None => Err(ConfigError::new(&top, format!("features.{k}"), "missing")),
        }
    };
    let get_count = |k: &str| -> Result<usize, ConfigError> {
        match feats.get(k) {
            Some((toml::Value::Integer(i), _)) if *i >= 1 => Ok(*i as usize),
            Some((_, p)) => Err(ConfigError::new(
                p,
                key_in(p, format!("features.{k}")),
                "expected a positive integer",
            )),
            None => Err(ConfigError::new(&top, format!("features.{k}"), "missing")),
        }
    };
    for (k, (_, p)) in &feats {
        if ![
            "pcid",
            "invpcid",
            "pti",
            "tlb_entries",
            "psc_entries",
            "mlp",
            "smt_slowdown",
            "invlpgb",
            "invlpgb_count_max",
        ]
        .contains(&k.as_str())
        {
            return Err(ConfigError::new(
                p,
                key_in(p, format!("features.{k}")),
                "unknown feature (expected pcid, invpcid, pti, tlb_entries, psc_entries, mlp, smt_slowdown, invlpgb, invlpgb_count_max)",
            ));
        }
    }
    let features = Features {
        pcid: get_bool("pcid")?,
        invpcid: get_bool("invpcid")?,
        pti: get_bool("pti")?,
        tlb_entries: get_count("tlb_entries")?,
        psc_entries: get_count("psc_entries")?,
        // Optional: 1 = every miss is paid in full.
        mlp: if feats.contains_key("mlp") {
            get_count("mlp")?
        } else {
            1
        },
        // Optional: 1.0 = SMT siblings do not slow each other down.
        smt_slowdown_permille: match feats.get("smt_slowdown") {
            None => 1000,
            Some((v, p)) => {
                let x = match v {
                    toml::Value::Float(f) => *f,
                    toml::Value::Integer(i) => *i as f64,
                    _ => f64::NAN,
                };
                if !(1.0..=4.0).contains(&x) {
                    return Err(ConfigError::new(
                        p,
                        key_in(p, "features.smt_slowdown".to_string()),
                        format!(
                            "expected a factor between 1.0 and 4.0 (got {})",
                            v.to_string().trim()
                        ),
                    ));
                }
                (x * 1000.0).round() as u32
            }
        },
        // The INVLPG erratum is a checker scenario feature; no profiled machine has it.
        invlpg_miss_global: false,
        // Optional: AMD's INVLPGB (false), and the pages one INVLPGB may name (1).
        invlpgb: if feats.contains_key("invlpgb") {
            get_bool("invlpgb")?
        } else {
            false
        },
        invlpgb_count_max: if feats.contains_key("invlpgb_count_max") {
            let n = get_count("invlpgb_count_max")?;
            if n > u16::MAX as usize {
                let p = &feats["invlpgb_count_max"].1;
                return Err(ConfigError::new(
                    p,
                    key_in(p, "features.invlpgb_count_max".to_string()),
                    format!("expected at most 65535 (the kernel keeps CPUID 0x8000_0008 EDX[15:0] + 1 in a u16; got {n})"),
                ));
            }
            n as u16
        } else {
            1
        },
    };
    Ok(CostProfile {
        name: shown_name,
        features,
        costs,
        fitted,
    })
}
