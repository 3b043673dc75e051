//! What a check returns (serializable to the JSON the Python layer and `--format json` print),
//! its text rendering, and the scenario listing.

use crate::error::CheckError;
use crate::scenario::{catalog_bug, Scenario};
use serde::Serialize;
use std::path::Path;

/// Runs of at least this many like steps print as one line ([`fold_run`]).
const FOLD_AT: usize = 4;

/// The first hexadecimal number (`0x…`) in `text`.
fn hex_at(text: &str) -> Option<&str> {
    let i = text.find("0x")?;
    let end = text[i + 2..]
        .find(|c: char| !c.is_ascii_hexdigit())
        .map_or(text.len(), |e| i + 2 + e);
    Some(&text[i..end])
}

/// How many steps from the first are alike: the same actor and the same text but for its
/// first hexadecimal number, and no violation among them but in the last one's text.
fn fold_run(steps: &[Step]) -> usize {
    fn key(s: &Step) -> Option<(&str, String)> {
        hex_at(&s.text).map(|h| (s.actor.as_str(), s.text.replacen(h, "", 1)))
    }
    let Some(k0) = key(&steps[0]) else { return 1 };
    steps
        .iter()
        .take_while(|s| !s.text.contains(" ⇒ ") && key(s).as_ref() == Some(&k0))
        .count()
        .max(1)
}

/// One numbered step of a counterexample.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Step {
    pub step: usize,
    pub actor: String,
    pub text: String,
}

/// Result of `shootdown check`.
#[derive(Clone, Debug, Serialize)]
pub struct CheckResult {
    pub scenario: String,
    pub mutant: Option<String>,
    /// The catalogued bug the mutant re-creates (id, title, fix, CVEs), if any.
    pub bug: Option<crate::catalog::BugInfo>,
    pub memory_model: String,
    /// `violation` | `verified` | `bound-reached` | `interrupted` | `unreached` (a mutant whose
    /// code no explored step ran: the search proves nothing about it).
    pub verdict: String,
    /// The invariant violated (`INV-STALE`, `INV-PTFREE`, `INV-ASID`, `INV-CTX`, `X4-DEADLOCK`).
    pub invariant: Option<String>,
    /// The oracle's description of the violation.
    pub detail: Option<String>,
    pub states: u64,
    pub transitions: u64,
    pub seconds: f64,
    pub counterexample: Vec<Step>,
    /// The scenario's deterministic setup steps, run (with the mutant on) before exploring:
    /// every counterexample starts after them.
    pub setup: Vec<Step>,
    /// `bfs`, `random` or `pct`.
    pub strategy: String,
    /// Reductions applied (`por`, `symmetry`).
    pub reductions: Vec<String>,
    /// The state bound of the search that gave the verdict (`--max-states`, or the default
    /// from the available memory: `bound.rs`).
    pub max_states: u64,
    /// What the verdict does not say by itself (a TSO mutant run under SC, a bound reached).
    pub notes: Vec<String>,
}

impl CheckResult {
    /// Text report: verdict line, size line, numbered steps.
    pub fn to_text(&self) -> String {
        let mut s = format!("verdict: {}", self.verdict);
        if let Some(i) = &self.invariant {
            s.push_str(&format!(" ({i})"));
        }
        s.push('\n');
        let mut what = vec![format!("scenario {}", self.scenario)];
        if let Some(m) = &self.mutant {
            match &self.bug {
                Some(b) => what.push(format!("mutant {m} [{}]", b.label())),
                None => what.push(format!("mutant {m}")),
            }
        }
        what.push(format!("memory model {}", self.memory_model));
        what.push(format!("strategy {}", self.strategy));
        s.push_str(&what.join(" · "));
        s.push('\n');
        s.push_str(&format!(
            "states: {}  transitions: {}  seconds: {:.2}\n",
            self.states, self.transitions, self.seconds
        ));
        for n in &self.notes {
            s.push_str(&format!("note: {n}\n"));
        }
        if let Some(d) = &self.detail {
            s.push_str(&format!("violation: {d}\n"));
        }
        if !self.counterexample.is_empty() {
            let all = self.setup.iter().chain(&self.counterexample);
            let aw = all.map(|x| x.actor.len()).max().unwrap_or(0);
            if !self.setup.is_empty() {
                s.push_str("setup (deterministic, before exploring):\n");
                let nw = self.setup.len().to_string().len();
                for st in &self.setup {
                    s.push_str(&format!(
                        "  s{:>nw$}. {:<aw$}  {}\n",
                        st.step, st.actor, st.text
                    ));
                }
            }
            s.push_str("counterexample:\n");
            let nw = self.counterexample.len().to_string().len();
            let steps = &self.counterexample;
            let mut i = 0;
            while i < steps.len() {
                let st = &steps[i];
                let run = fold_run(&steps[i..]);
                if run >= FOLD_AT {
                    // A walk over entries that all read the same (a TDP iterator's empty
                    // slots): one line, its steps' range and the numbers' first and last.
                    let last = &steps[i + run - 1];
                    let (first_n, last_n) = (hex_at(&st.text), hex_at(&last.text));
                    let text = st.text.replacen(
                        first_n.unwrap_or(""),
                        &format!("{}…{}", first_n.unwrap_or(""), last_n.unwrap_or("")),
                        1,
                    );
                    let steps_label = format!("{}–{}", st.step, last.step);
                    s.push_str(&format!(
                        "  {steps_label:>nw$}. {:<aw$}  {text} ({run} steps)\n",
                        st.actor
                    ));
                    i += run;
                    continue;
                }
                s.push_str(&format!(
                    "  {:>nw$}. {:<aw$}  {}\n",
                    st.step, st.actor, st.text
                ));
                i += 1;
            }
        }
        s
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("serializable")
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MutantInfo {
    pub name: String,
    /// Catalog id (`N3`) or null.
    pub bug: Option<String>,
    /// The catalogued bug's fixing commit and CVEs (`docs/bugs/CATALOG.md`).
    pub fix: Option<String>,
    pub cves: Vec<String>,
    pub description: String,
    /// The invariant the mutant must violate.
    pub expect: Option<String>,
    /// Memory model under which it is found (`sc` or `tso`).
    pub memory_model: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ScenarioInfo {
    pub scenario: String,
    pub description: String,
    pub mutants: Vec<MutantInfo>,
    /// The invariant the unmutated protocol violates here (a documented finding), if any.
    pub finding: Option<FindingInfo>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FindingInfo {
    pub expect: String,
    pub description: String,
}

impl ScenarioInfo {
    pub fn of(s: &Scenario) -> ScenarioInfo {
        ScenarioInfo {
            scenario: s.name.clone(),
            description: s.file.description.trim().to_string(),
            mutants: s
                .file
                .mutants
                .iter()
                .map(|m| {
                    let id = catalog_bug(&m.name);
                    let entry = id.and_then(crate::catalog::lookup);
                    MutantInfo {
                        name: m.name.clone(),
                        bug: id.map(str::to_string),
                        fix: entry.and_then(|b| b.fix.clone()),
                        cves: entry.map(|b| b.cves.clone()).unwrap_or_default(),
                        description: m.description.trim().to_string(),
                        expect: m.expect.clone(),
                        memory_model: m.memory_model.clone().unwrap_or_else(|| "sc".into()),
                    }
                })
                .collect(),
            finding: s.file.finding.as_ref().map(|f| FindingInfo {
                expect: f.expect.clone(),
                description: f.description.trim().to_string(),
            }),
        }
    }
}

/// The catalog entry of the bug mutant `name` re-creates (none for a seeded mistake).
pub fn mutant_bug(name: Option<&str>) -> Option<crate::catalog::BugInfo> {
    crate::catalog::lookup(catalog_bug(name?)?).cloned()
}

/// Every `*.toml` scenario of `dir`, sorted by file name.
pub fn list(dir: &Path) -> Result<Vec<ScenarioInfo>, CheckError> {
    let d = dir.display().to_string();
    let rd = std::fs::read_dir(dir).map_err(|e| CheckError::new(&d, "-", e.to_string()))?;
    let mut files: Vec<_> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| Scenario::load(p).map(|s| ScenarioInfo::of(&s)))
        .collect()
}

/// `list` as the JSON `shootdown check --list --format json` prints.
pub fn list_json(dir: &Path) -> Result<String, CheckError> {
    Ok(serde_json::to_string_pretty(&list(dir)?).expect("serializable"))
}

/// Text listing.
pub fn list_text(items: &[ScenarioInfo]) -> String {
    let mut s = String::new();
    for sc in items {
        s.push_str(&format!("{}  {}\n", sc.scenario, sc.description));
        if let Some(f) = &sc.finding {
            s.push_str(&format!("  finding: {} ({})\n", f.expect, f.description));
        }
        let w = sc.mutants.iter().map(|m| m.name.len()).max().unwrap_or(0);
        for m in &sc.mutants {
            let bug = m
                .bug
                .as_deref()
                .map(|b| format!("[{}] ", crate::catalog::label(b, &m.cves, m.fix.as_deref())))
                .unwrap_or_default();
            let expect = m
                .expect
                .as_ref()
                .map(|e| format!(" (expect {e} under {})", m.memory_model))
                .unwrap_or_default();
            s.push_str(&format!(
                "  - {:<w$}  {bug}{}{expect}\n",
                m.name, m.description
            ));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(n: usize, actor: &str, text: &str) -> Step {
        Step {
            step: n,
            actor: actor.into(),
            text: text.into(),
        }
    }

    #[test]
    fn a_walk_over_empty_entries_folds_into_one_line() {
        let mut steps: Vec<Step> = (0..6)
            .map(|i| {
                step(
                    i + 1,
                    "qemu",
                    &format!("tdp_iter: gfn {:#x} level 1: not present", i),
                )
            })
            .collect();
        steps.push(step(7, "qemu", "tdp_iter: gfn 0x6 level 1: a leaf"));
        assert_eq!(hex_at(&steps[3].text), Some("0x3"));
        assert_eq!(fold_run(&steps), 6);
        assert_eq!(fold_run(&steps[6..]), 1);
        // Another actor, or a violation, ends a run.
        steps[2].actor = "vcpu0".into();
        assert_eq!(fold_run(&steps), 2);
        let v = [
            step(1, "a", "x 0x1"),
            step(2, "a", "x 0x2"),
            step(3, "a", "x 0x3  ⇒ INV-STALE"),
        ];
        assert_eq!(fold_run(&v), 2);
    }
}
