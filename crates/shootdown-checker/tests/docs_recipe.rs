//! docs/checker.md's scenario recipe names every key and operation the scenario parser accepts:
//! the lists come from the parser itself (serde's "expected one of …" for an unknown name), so a
//! key or op added to `scenario.rs` without a word in the docs fails here.

use shootdown_checker::scenario::ScenarioFile;
use std::path::Path;

/// The names serde lists for an unknown field or variant in `src`.
fn accepted(src: &str) -> Vec<String> {
    let e = toml::from_str::<ScenarioFile>(src)
        .map(|_| ())
        .expect_err("bogus names are refused")
        .to_string();
    let list = e
        .split("expected one of ")
        .nth(1)
        .or_else(|| e.split("expected ").nth(1))
        .unwrap_or_else(|| panic!("no list in: {e}"));
    list.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

const HEAD: &str = "description = \"d\"\ncpus = 1\n";

#[test]
fn every_scenario_key_and_op_is_in_the_recipe() {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/checker.md"),
    )
    .unwrap();
    let cases = [
        ("top level", format!("{HEAD}bogus = 1\n")),
        ("[features]", format!("{HEAD}[features]\nbogus = 1\n")),
        (
            "[[mms]]",
            format!("{HEAD}[[mms]]\nname = \"m\"\nbogus = 1\n"),
        ),
        (
            "[[tasks]]",
            format!("{HEAD}[[tasks]]\nname = \"t\"\ncpu = 0\nprogram = []\nbogus = 1\n"),
        ),
        (
            "task ops",
            format!("{HEAD}[[tasks]]\nname = \"t\"\ncpu = 0\nprogram = [{{ bogus = {{}} }}]\n"),
        ),
        (
            "[[files]]",
            format!("{HEAD}[[files]]\nname = \"f\"\nnpages = 1\nbogus = 1\n"),
        ),
        (
            "mms.vmas",
            format!("{HEAD}[[mms]]\nname = \"m\"\nvmas = [{{ start = 1, npages = 1, file = \"f\", bogus = 1 }}]\n"),
        ),
        (
            "[[setup]]",
            format!("{HEAD}[[setup]]\ncpu = 0\nbogus = 1\n"),
        ),
        (
            "[[nmi]]",
            format!("{HEAD}[[nmi]]\ncpu = 0\nvpn = 1\nbogus = 1\n"),
        ),
        ("[host]", format!("{HEAD}[host]\nbogus = 1\n")),
        ("[kvm]", format!("{HEAD}[kvm]\nbogus = 1\n")),
        (
            "[[kvm.threads]] ops",
            format!("{HEAD}[kvm]\n[[kvm.threads]]\nname = \"q\"\nprogram = [{{ bogus = {{}} }}]\n"),
        ),
        (
            "[[mutants]]",
            format!("{HEAD}[[mutants]]\nname = \"m\"\ndescription = \"d\"\nbogus = 1\n"),
        ),
    ];
    let mut missing = Vec::new();
    for (what, src) in &cases {
        let names = accepted(src);
        assert!(names.len() > 1, "{what}: {names:?}");
        for n in names {
            let written = [
                format!("`{n}`"),
                format!("`{n} ="),
                format!("\"{n}\""),
                format!("`[{n}]`"),
                format!("`[[{n}]]`"),
                format!("[{n}]"),
                format!(".{n}]"),
            ];
            // `key = …` in a TOML example, after any indentation or `{ `.
            let assigned = doc.match_indices(&format!("{n} =")).any(|(i, _)| {
                !doc[..i]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_')
            });
            if !assigned && !written.iter().any(|w| doc.contains(w.as_str())) {
                missing.push(format!("{what}: {n}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/checker.md does not mention:\n{}",
        missing.join("\n")
    );
}
