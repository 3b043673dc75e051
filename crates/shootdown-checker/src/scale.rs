//! `shootdown check --set KEY=VALUE`: a scenario's keys overridden before it is validated
//! (`options.smp_call=concurrent`, `mms.0.map.0.npages=4`: the syntax of
//! [`shootdown_engine::overrides`]), and `cpus=N` to grow a scenario.
//!
//! **Growing.** A larger `cpus` alone would add CPUs that run nothing. So the new CPUs each run
//! copies of one *template* CPU's tasks and setup steps: the last CPU of the last `symmetric`
//! group if the scenario declares one (the new CPUs join that group), else the highest-numbered
//! CPU that runs a task. That is the scenario's last role, played by more CPUs: a flush then has
//! more targets, a lock more contenders. Copies are named `NAME_cpuN`. Each growth is reported
//! in the check's notes, so a verdict never hides what was run. A smaller `cpus` is refused
//! (tasks would lose their CPU): edit the file for that.

use crate::error::CheckError;
use shootdown_engine::overrides::{parse_set, set_path};

/// Apply `sets` to the scenario's table; the notes that say what a growth added.
pub fn apply(
    file: &str,
    doc: &mut toml::Table,
    sets: &[String],
) -> Result<Vec<String>, CheckError> {
    let before = cpus_of(doc);
    for s in sets {
        let (key, value) = parse_set(s).map_err(|(k, why)| CheckError::new(file, &k, why))?;
        set_path(doc, &key, value).map_err(|why| CheckError::new(file, &key, why))?;
    }
    let after = cpus_of(doc);
    match (before, after) {
        (Some(b), Some(a)) if a > b => grow(file, doc, b, a).map(|n| vec![n]),
        (Some(b), Some(a)) if a < b => Err(CheckError::new(
            file,
            "cpus",
            format!("--set can only grow a scenario ({b} CPUs, asked for {a}): edit the file to shrink it"),
        )),
        _ => Ok(vec![]),
    }
}

fn cpus_of(doc: &toml::Table) -> Option<usize> {
    doc.get("cpus")?
        .as_integer()
        .and_then(|n| usize::try_from(n).ok())
}

/// The `cpu` of a task or setup entry.
fn cpu_of(v: &toml::Value) -> Option<usize> {
    v.get("cpu")?
        .as_integer()
        .and_then(|n| usize::try_from(n).ok())
}

/// Copy the template CPU's tasks and setup steps to CPUs `from..to`.
fn grow(file: &str, doc: &mut toml::Table, from: usize, to: usize) -> Result<String, CheckError> {
    let groups = doc
        .get("symmetric")
        .and_then(toml::Value::as_array)
        .cloned();
    let from_group = groups
        .as_ref()
        .and_then(|g| g.last())
        .and_then(|g| g.as_array()?.last()?.as_integer())
        .and_then(|c| usize::try_from(c).ok());
    let tasks = doc
        .get("tasks")
        .and_then(toml::Value::as_array)
        .cloned()
        .unwrap_or_default();
    let template = from_group
        .or_else(|| tasks.iter().filter_map(cpu_of).max())
        .ok_or_else(|| {
            CheckError::new(file, "cpus", "--set cpus: the scenario has no task to copy")
        })?;
    let mine: Vec<toml::Value> = tasks
        .iter()
        .filter(|t| cpu_of(t) == Some(template))
        .cloned()
        .collect();
    let names: Vec<String> = mine
        .iter()
        .filter_map(|t| t.get("name")?.as_str().map(str::to_string))
        .collect();
    let setup: Vec<toml::Value> = doc
        .get("setup")
        .and_then(toml::Value::as_array)
        .map(|s| {
            s.iter()
                .filter(|x| cpu_of(x) == Some(template))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    for c in from..to {
        let rename = |name: &str| format!("{name}_cpu{c}");
        let copy = |v: &toml::Value| {
            let mut v = v.clone();
            if let Some(t) = v.as_table_mut() {
                t.insert("cpu".into(), toml::Value::Integer(c as i64));
                if let Some(n) = t.get("name").and_then(toml::Value::as_str).map(rename) {
                    t.insert("name".into(), toml::Value::String(n));
                }
                // A setup step that runs until one of the template's tasks reaches user mode
                // runs until its copy does.
                if let Some(u) = t.get("until").and_then(toml::Value::as_str) {
                    let u = match u.split_once(':') {
                        Some((kind, n)) if names.iter().any(|x| x == n) => {
                            format!("{kind}:{}", rename(n))
                        }
                        _ => u.to_string(),
                    };
                    t.insert("until".into(), toml::Value::String(u));
                }
            }
            v
        };
        push_all(doc, "tasks", mine.iter().map(copy).collect());
        push_all(doc, "setup", setup.iter().map(copy).collect());
    }
    if from_group.is_some() {
        if let Some(toml::Value::Array(gs)) = doc.get_mut("symmetric") {
            if let Some(toml::Value::Array(g)) = gs.last_mut() {
                g.extend((from..to).map(|c| toml::Value::Integer(c as i64)));
            }
        }
    }
    let range = if to - from == 1 {
        format!("cpu{from} runs")
    } else {
        format!("cpu{from}–cpu{} each run", to - 1)
    };
    Ok(format!(
        "--set cpus={to}: {range} a copy of cpu{template}'s tasks ({}){}",
        if names.is_empty() {
            "none".into()
        } else {
            names.join(", ")
        },
        if from_group.is_some() {
            ", in its symmetric group"
        } else {
            ""
        }
    ))
}

fn push_all(doc: &mut toml::Table, key: &str, items: Vec<toml::Value>) {
    if items.is_empty() {
        return;
    }
    let arr = doc
        .entry(key.to_string())
        .or_insert_with(|| toml::Value::Array(vec![]));
    if let toml::Value::Array(a) = arr {
        a.extend(items);
    }
}
