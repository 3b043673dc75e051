//! `--set KEY=VALUE`, the part every configuration file shares (experiments, checker
//! scenarios): KEY is a dotted path (`workload.threads`, `options.smp_call`, `mms.0.map.0.npages`:
//! a number indexes an array); VALUE is a TOML value, or a bare string when it does not parse as
//! one — except a value that opens an array, an inline table or a quoted string, which must
//! parse (a typo there is an error, not a string). What a file's own keys mean (variants, a
//! scenario's CPUs) its loader decides.

/// Why a `--set` was refused: the key it names (the whole argument if it has no `=`) and why.
pub type SetError = (String, String);

/// Split `KEY=VALUE` and parse the value.
pub fn parse_set(s: &str) -> Result<(String, toml::Value), SetError> {
    let Some((key, raw)) = s.split_once('=') else {
        return Err((s.to_string(), "--set expects KEY=VALUE".into()));
    };
    let key = key.trim().to_string();
    if key.is_empty() || key.split('.').any(str::is_empty) {
        return Err((key, "--set: empty key or path segment".into()));
    }
    let value = match toml::from_str::<toml::Table>(&format!("v = {raw}")) {
        Ok(mut t) => t.remove("v").expect("parsed"),
        Err(e) if raw.trim_start().starts_with(['[', '{', '"', '\'']) => {
            let why = e.message().lines().next().unwrap_or("invalid").trim();
            return Err((
                key,
                format!("--set: invalid TOML value {}: {why}", raw.trim()),
            ));
        }
        Err(_) => toml::Value::String(raw.trim().to_string()),
    };
    Ok((key, value))
}

/// Put `value` at the dotted `key` of `doc`, creating tables on the way; a numeric segment
/// names an element of an existing array (appending is not a `--set`).
pub fn set_path(doc: &mut toml::Table, key: &str, value: toml::Value) -> Result<(), String> {
    let segs: Vec<&str> = key.split('.').collect();
    let mut slot = doc
        .entry(segs[0].to_string())
        .or_insert_with(|| toml::Value::Table(Default::default()));
    for (i, seg) in segs.iter().enumerate().skip(1) {
        let walked = segs[..i].join(".");
        let last = i + 1 == segs.len();
        slot = match slot {
            toml::Value::Table(t) => {
                if last {
                    t.insert(seg.to_string(), value);
                    return Ok(());
                }
                t.entry(seg.to_string())
                    .or_insert_with(|| toml::Value::Table(Default::default()))
            }
            toml::Value::Array(a) => {
                let n = a.len();
                let Some(e) = seg.parse::<usize>().ok().and_then(|j| a.get_mut(j)) else {
                    return Err(format!(
                        "'{walked}' is an array of {n}: index it with 0 to {}",
                        n.saturating_sub(1)
                    ));
                };
                if last {
                    *e = value;
                    return Ok(());
                }
                e
            }
            _ => return Err(format!("'{walked}' is not a table")),
        };
    }
    // A one-segment key: the slot is the top-level entry.
    *slot = value;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_reach_into_tables_and_array_elements() {
        let mut t: toml::Table =
            toml::from_str("cpus = 3\n[[mms]]\nname = \"a\"\nmap = [{ start = 1, npages = 1 }]\n")
                .unwrap();
        for s in [
            "cpus=4",
            "mms.0.map.0.npages=8",
            "options.smp_call=concurrent",
        ] {
            let (k, v) = parse_set(s).unwrap();
            set_path(&mut t, &k, v).unwrap();
        }
        assert_eq!(t["cpus"].as_integer(), Some(4));
        assert_eq!(t["mms"][0]["map"][0]["npages"].as_integer(), Some(8));
        assert_eq!(t["options"]["smp_call"].as_str(), Some("concurrent"));
        let (k, v) = parse_set("mms.3.name=x").unwrap();
        assert_eq!(
            set_path(&mut t, &k, v).unwrap_err(),
            "'mms' is an array of 1: index it with 0 to 0"
        );
        let (k, v) = parse_set("cpus.x=1").unwrap();
        assert_eq!(
            set_path(&mut t, &k, v).unwrap_err(),
            "'cpus' is not a table"
        );
        assert_eq!(parse_set("cpus").unwrap_err().1, "--set expects KEY=VALUE");
        assert!(parse_set("a=[1,")
            .unwrap_err()
            .1
            .starts_with("--set: invalid TOML value [1,"));
    }
}
