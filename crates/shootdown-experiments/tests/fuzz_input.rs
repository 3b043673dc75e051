//! Bad input, generated: every shipped experiment file with one value replaced, one key
//! removed or one unknown key added must load or fail with one line naming the file — never
//! panic, hang or exhaust memory. The hand-written cases of `bad_input.rs` pin the messages;
//! this test looks for the cases nobody thought of.

use proptest::prelude::*;
use shootdown_experiments::load;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The shipped experiment files, parsed. Seed 000's is made cheap to validate (a 64 MiB file,
/// two rows): loading builds every row's machine, and a 3 GiB file's PTEs take ~0.1 s a row.
fn corpus() -> Vec<(String, toml::Table)> {
    let mut out = Vec::new();
    for dir in ["experiments/seeds", "experiments/examples"] {
        let mut paths: Vec<_> = std::fs::read_dir(repo().join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect();
        paths.sort();
        for p in paths {
            let mut doc: toml::Table = toml::from_str(&std::fs::read_to_string(&p).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            if let Some(w) = doc.get_mut("workload").and_then(|w| w.as_table_mut()) {
                if w.contains_key("file_total_size_mb") {
                    w.insert("file_total_size_mb".into(), toml::Value::Integer(64));
                    let e = doc["experiment"].as_table_mut().unwrap();
                    e.insert("rows".into(), toml::Value::try_from([1, 48]).unwrap());
                    e.remove("quick_rows");
                }
            }
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            out.push((name, doc));
        }
    }
    out
}

/// Every key path of `t` (tables are descended into; arrays are leaves).
fn key_paths(t: &toml::Table, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    for (k, v) in t {
        prefix.push(k.clone());
        out.push(prefix.clone());
        if let toml::Value::Table(sub) = v {
            key_paths(sub, prefix, out);
        }
        prefix.pop();
    }
}

/// Values that have broken parsers before: wrong types, signs, zero, extremes, empties.
fn odd_value(i: usize) -> toml::Value {
    use toml::Value as V;
    match i % 16 {
        0 => V::Integer(-1),
        1 => V::Integer(0),
        2 => V::Integer(i64::MAX),
        3 => V::Integer(1 << 40),
        4 => V::Float(-0.5),
        5 => V::Float(f64::NAN),
        6 => V::Float(f64::INFINITY),
        7 => V::Float(1e300),
        8 => V::String(String::new()),
        9 => V::String("x".into()),
        10 => V::Boolean(true),
        11 => V::Array(Vec::new()),
        12 => V::Array(vec![V::Integer(-3), V::String("y".into())]),
        13 => V::Table(toml::Table::new()),
        14 => V::Integer(3),
        _ => V::Float(0.0),
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    /// Key index, value index ([`odd_value`]).
    Replace(usize, usize),
    Remove(usize),
    AddUnknown(usize),
    /// `[profile_override.cost]` with one cost key set to an odd value.
    OverrideCost(usize, usize),
}

/// Indices are taken modulo the number of files, keys and values.
fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        6 => (any::<usize>(), 0usize..16).prop_map(|(k, v)| Mutation::Replace(k, v)),
        2 => any::<usize>().prop_map(Mutation::Remove),
        1 => any::<usize>().prop_map(Mutation::AddUnknown),
        3 => (any::<usize>(), 0usize..16).prop_map(|(k, v)| Mutation::OverrideCost(k, v)),
    ]
}

fn table_at<'a>(doc: &'a mut toml::Table, path: &[String]) -> &'a mut toml::Table {
    let mut t = doc;
    for k in path {
        t = t.get_mut(k).and_then(|v| v.as_table_mut()).unwrap();
    }
    t
}

fn is_table(doc: &toml::Table, path: &[String]) -> bool {
    let mut v = None;
    let mut t = doc;
    for k in path {
        v = t.get(k);
        match v {
            Some(toml::Value::Table(sub)) => t = sub,
            _ => return false,
        }
    }
    v.is_some()
}

static CASE: AtomicUsize = AtomicUsize::new(0);

proptest! {
    #![proptest_config(ProptestConfig::with_cases(160))]
    #[test]
    fn mutated_experiment_files_load_or_fail_cleanly(file in any::<usize>(), m in mutation()) {
        static CORPUS: OnceLock<Vec<(String, toml::Table)>> = OnceLock::new();
        let corpus = CORPUS.get_or_init(corpus);
        let (name, doc) = &corpus[file % corpus.len()];
        let mut doc = doc.clone();
        let mut paths = Vec::new();
        key_paths(&doc, &mut Vec::new(), &mut paths);
        let what = match m {
            Mutation::Replace(k, v) => {
                let path = &paths[k % paths.len()];
                let (last, parent) = path.split_last().unwrap();
                table_at(&mut doc, parent).insert(last.clone(), odd_value(v));
                format!("{} = {}", path.join("."), odd_value(v))
            }
            Mutation::Remove(k) => {
                let path = &paths[k % paths.len()];
                let (last, parent) = path.split_last().unwrap();
                table_at(&mut doc, parent).remove(last);
                format!("removed {}", path.join("."))
            }
            Mutation::AddUnknown(k) => {
                // Into one of the file's tables, or at the top.
                let tables: Vec<&Vec<String>> =
                    paths.iter().filter(|p| is_table(&doc, p)).collect();
                let parent = match tables.len() {
                    0 => Vec::new(),
                    n => tables[k % n].clone(),
                };
                table_at(&mut doc, &parent).insert("no_such_key".into(), toml::Value::Integer(1));
                format!("added {}.no_such_key", parent.join("."))
            }
            Mutation::OverrideCost(k, v) => {
                let keys = shootdown_hw::profile::COST_KEYS;
                let key = keys[k % keys.len()].0;
                let mut cost = toml::Table::new();
                cost.insert(key.into(), odd_value(v));
                let mut ovr = toml::Table::new();
                ovr.insert("cost".into(), toml::Value::Table(cost));
                doc.insert("profile_override".into(), toml::Value::Table(ovr));
                format!("profile_override.cost.{key} = {}", odd_value(v))
            }
        };
        let dir = repo().join("target").join("fuzz-input-tests");
        std::fs::create_dir_all(&dir).unwrap();
        let fname = format!("{name}-{}.toml", CASE.fetch_add(1, Ordering::Relaxed));
        let p = dir.join(&fname);
        // NaN and infinities have TOML spellings (nan, inf); the serializer writes them.
        std::fs::write(&p, toml::to_string(&doc).unwrap()).unwrap();
        let got = std::panic::catch_unwind(|| load(&p, &[]).map(|_| ()).map_err(|e| e.to_string()));
        let _ = std::fs::remove_file(&p);
        match got {
            Err(_) => prop_assert!(false, "{name} with {what}: load panicked"),
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                prop_assert!(e.contains(&fname), "{name} with {what}: error does not name the file: {e}");
                prop_assert_eq!(e.lines().count(), 1, "{} with {}: not one line: {}", name, what, e);
            }
        }
    }
}
