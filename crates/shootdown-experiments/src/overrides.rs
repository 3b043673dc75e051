//! `--set KEY=VALUE`: override any key of an experiment file before it is validated (the
//! syntax: [`shootdown_engine::overrides`]). What is particular to experiments: a key inside a
//! variant must name a variant the file has, and `workload.K` wins over `[quick.workload] K`.

use crate::ConfigError;
use shootdown_engine::overrides::{parse_set, set_path};
use std::path::Path;

/// A key inside a variant (`variants.NAME.options.X`, `variants.NAME.label`) must name one the
/// experiment has: a typo would otherwise add a variant and leave the intended one as it was.
/// A new variant is added whole (`variants.NAME={ label = …, options = { … } }`).
fn check_variant(
    path: &Path,
    doc: &toml::Table,
    key: &str,
    segs: &[&str],
) -> Result<(), ConfigError> {
    if segs.len() < 3 || segs[0] != "variants" {
        return Ok(());
    }
    let Some(toml::Value::Table(variants)) = doc.get("variants") else {
        return Ok(());
    };
    if variants.contains_key(segs[1]) {
        return Ok(());
    }
    let known: Vec<&str> = variants.keys().map(String::as_str).collect();
    Err(ConfigError::new(
        path,
        key,
        format!(
            "--set: no variant '{}' (the experiment has: {}); a new variant is set whole: \
             variants.{}={{ label = \"…\", options = {{ … }} }}",
            segs[1],
            known.join(", "),
            segs[1]
        ),
    ))
}

/// Apply every `--set` to the experiment file's table, in order.
pub fn apply(path: &Path, doc: &mut toml::Table, sets: &[String]) -> Result<(), ConfigError> {
    for s in sets {
        let (key, value) =
            parse_set(s).map_err(|(k, why)| ConfigError::new(path, k.as_str(), why))?;
        let segs: Vec<&str> = key.split('.').collect();
        check_variant(path, doc, &key, &segs)?;
        set_path(doc, &key, value).map_err(|why| ConfigError::new(path, key.as_str(), why))?;
        // An explicit `--set workload.K` wins over the file's `[quick.workload] K` too.
        if let ["workload", k] = segs.as_slice() {
            if let Some(toml::Value::Table(q)) = doc
                .get_mut("quick")
                .and_then(|q| q.as_table_mut())
                .and_then(|q| q.get_mut("workload"))
            {
                q.remove(*k);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_inside_an_unknown_variant_is_an_error_listing_the_known_ones() {
        let mut t: toml::Table =
            toml::from_str("[variants.before]\noptions = {}\n[variants.after]\noptions = {}\n")
                .unwrap();
        let e = apply(
            Path::new("x.toml"),
            &mut t,
            &["variants.aftr.options.smp_call=concurrent".into()],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("x.toml: variants.aftr.options.smp_call: --set: no variant 'aftr' (the experiment has: before, after)"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1);
        assert_eq!(
            t["variants"].as_table().unwrap().len(),
            2,
            "nothing was added"
        );
        // Known variants take keys; a new one is added whole.
        apply(
            Path::new("x.toml"),
            &mut t,
            &[
                "variants.after.options.smp_call=concurrent".into(),
                "variants.third={ label = \"3\", options = { pcid = false } }".into(),
            ],
        )
        .unwrap();
        assert_eq!(
            t["variants"]["after"]["options"]["smp_call"].as_str(),
            Some("concurrent")
        );
        assert_eq!(t["variants"]["third"]["label"].as_str(), Some("3"));
    }

    #[test]
    fn a_malformed_array_or_inline_table_is_an_error_naming_the_key() {
        for (set, why) in [
            ("experiment.rows=[1,2", "invalid TOML value [1,2"),
            ("variants.after.options={a=1,a=2}", "duplicate key"),
            ("workload.name=\"open", "invalid TOML value \"open"),
        ] {
            let mut t = toml::Table::new();
            let e = apply(Path::new("x.toml"), &mut t, &[set.to_string()]).unwrap_err();
            let msg = e.to_string();
            let key = set.split('=').next().unwrap();
            assert!(msg.starts_with(&format!("x.toml: {key}: --set: ")), "{msg}");
            assert!(msg.contains(why), "{msg}");
            assert_eq!(msg.lines().count(), 1, "{msg}");
        }
        // A bare word is still a string.
        let mut t = toml::Table::new();
        apply(
            Path::new("x.toml"),
            &mut t,
            &["a.b=remote_then_local".into()],
        )
        .unwrap();
        assert_eq!(t["a"]["b"].as_str(), Some("remote_then_local"));
    }
    #[test]
    fn an_explicit_set_wins_over_the_quick_value() {
        let mut t: toml::Table = toml::from_str(
            "[workload]\niterations = 1000\n[quick.workload]\niterations = 300\nwarmup = 1",
        )
        .unwrap();
        apply(
            Path::new("x.toml"),
            &mut t,
            &["workload.iterations=500".into()],
        )
        .unwrap();
        assert_eq!(t["workload"]["iterations"].as_integer(), Some(500));
        assert!(t["quick"]["workload"].get("iterations").is_none());
        assert_eq!(t["quick"]["workload"]["warmup"].as_integer(), Some(1));
        // Setting the quick value itself still works.
        apply(
            Path::new("x.toml"),
            &mut t,
            &["quick.workload.iterations=7".into()],
        )
        .unwrap();
        assert_eq!(t["quick"]["workload"]["iterations"].as_integer(), Some(7));
    }

    #[test]
    fn sets_nested_values_with_types() {
        let mut t: toml::Table = toml::from_str("[workload]\nthreads = 1").unwrap();
        apply(
            Path::new("x.toml"),
            &mut t,
            &[
                "workload.threads=8".into(),
                "variants.a.options.smp_call=concurrent".into(),
            ],
        )
        .unwrap();
        assert_eq!(t["workload"]["threads"].as_integer(), Some(8));
        assert_eq!(
            t["variants"]["a"]["options"]["smp_call"].as_str(),
            Some("concurrent")
        );
        let e = apply(Path::new("x.toml"), &mut t, &["nokey".into()]).unwrap_err();
        assert!(e.to_string().contains("KEY=VALUE"));
    }
}
