//! Profile files (`profiles/<name>.toml`): `[profile]` (name, description, inherits),
//! `[features]` and `[cost]` (each cost a number of ns or `{ value, source }`). A profile may
//! inherit another and override any subset; the result must define every cost key.

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
    Err(ConfigError::new(from, "experiment.profile", format!("no profile '{name}' (looked for {name}.toml in profiles/ next to the experiment and its parents, and $SHOOTDOWN_PROFILES)")))
}

fn read_toml(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(path, "", format!("cannot read: {e}")))?;
    toml::from_str(&text)
        .map_err(|e| ConfigError::new(path, "", format!("malformed TOML: {}", e.message())))
}

/// Load a profile by name, following `inherits`.
pub fn load_profile(name: &str, dirs: &[PathBuf], from: &Path) -> Result<CostProfile, ConfigError> {
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
        let t = read_toml(&path)?;
        chain.push(cur.clone());
        for k in t.keys() {
            if !["profile", "features", "cost"].contains(&k.as_str()) {
                return Err(ConfigError::new(
                    &path,
                    k.as_str(),
                    "unknown section (expected profile, features, cost)",
                ));
            }
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
    // Apply from the root ancestor down.
    let mut feats: BTreeMap<String, (toml::Value, PathBuf)> = BTreeMap::new();
    let mut costs: BTreeMap<String, f64> = BTreeMap::new();
    let mut cost_src: BTreeMap<String, PathBuf> = BTreeMap::new();
    for (path, t) in files.iter().rev() {
        if let Some(f) = t.get("features") {
            let f = f
                .as_table()
                .ok_or_else(|| ConfigError::new(path, "features", "expected a table"))?;
            for (k, v) in f {
                feats.insert(k.clone(), (v.clone(), path.clone()));
            }
        }
        if let Some(c) = t.get("cost") {
            let c = c
                .as_table()
                .ok_or_else(|| ConfigError::new(path, "cost", "expected a table"))?;
            for (k, v) in c {
                let key = format!("cost.{k}");
                let n = match v {
                    toml::Value::Integer(i) => *i as f64,
                    toml::Value::Float(f) => *f,
                    toml::Value::Table(t) => {
                        for tk in t.keys() {
                            if tk != "value" && tk != "source" {
                                return Err(ConfigError::new(
                                    path,
                                    format!("{key}.{tk}"),
                                    "unknown key (expected value, source)",
                                ));
                            }
                        }
                        match t.get("value") {
                            Some(toml::Value::Integer(i)) => *i as f64,
                            Some(toml::Value::Float(f)) => *f,
                            _ => {
                                return Err(ConfigError::new(
                                    path,
                                    format!("{key}.value"),
                                    "expected a number of nanoseconds",
                                ))
                            }
                        }
                    }
                    _ => {
                        return Err(ConfigError::new(
                            path,
                            key,
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
        let file = cost_src
            .get(&k)
            .cloned()
            .unwrap_or_else(|| files[0].0.clone());
        ConfigError::new(&file, format!("cost.{k}"), reason)
    })?;
    let get_bool = |k: &str| -> Result<bool, ConfigError> {
        match feats.get(k) {
            Some((toml::Value::Boolean(b), _)) => Ok(*b),
            Some((_, p)) => Err(ConfigError::new(
                p,
                format!("features.{k}"),
                "expected true or false",
            )),
            None => Err(ConfigError::new(
                &files[0].0,
                format!("features.{k}"),
                "missing",
            )),
        }
    };
    let get_count = |k: &str| -> Result<usize, ConfigError> {
        match feats.get(k) {
            Some((toml::Value::Integer(i), _)) if *i >= 1 => Ok(*i as usize),
            Some((_, p)) => Err(ConfigError::new(
                p,
                format!("features.{k}"),
                "expected a positive integer",
            )),
            None => Err(ConfigError::new(
                &files[0].0,
                format!("features.{k}"),
                "missing",
            )),
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
        ]
        .contains(&k.as_str())
        {
            return Err(ConfigError::new(
                p,
                format!("features.{k}"),
                "unknown feature (expected pcid, invpcid, pti, tlb_entries, psc_entries, mlp)",
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
    };
    Ok(CostProfile {
        name: name.to_string(),
        features,
        costs,
    })
}
