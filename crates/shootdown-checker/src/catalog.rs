//! The catalog of real bugs (`docs/bugs/CATALOG.md`), as `check --list` and the check results
//! name them: each entry's id, title, fixing commit and CVEs, read from the entry's heading
//! (`### K1 — title`) and its `- **Ids:** fix COMMIT; CVE-…` line. The document is the one place
//! they are written; it is compiled in, so a shipped binary carries the catalog it was built
//! with.

use serde::Serialize;
use std::sync::OnceLock;

/// One catalog entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BugInfo {
    /// `K1`, `N3`, `A2`, …
    pub id: String,
    pub title: String,
    /// The fixing commit (an abbreviated id, or a description where none was retrieved).
    pub fix: Option<String>,
    pub cves: Vec<String>,
}

const CATALOG: &str = include_str!("../../../docs/bugs/CATALOG.md");

/// Every entry of the catalog, in document order.
pub fn entries() -> &'static [BugInfo] {
    static ENTRIES: OnceLock<Vec<BugInfo>> = OnceLock::new();
    ENTRIES.get_or_init(|| parse(CATALOG))
}

/// The entry with this id.
pub fn lookup(id: &str) -> Option<&'static BugInfo> {
    entries().iter().find(|b| b.id == id)
}

/// Entries of a catalog document: a `### ID — title` heading opens one; the first
/// `- **Ids:**` line after it gives its fix and CVEs (`;`-separated `fix …` and `CVE-…` items).
fn parse(doc: &str) -> Vec<BugInfo> {
    let mut out: Vec<BugInfo> = Vec::new();
    let mut ids_seen = false;
    for line in doc.lines() {
        if let Some(h) = line.strip_prefix("### ") {
            if let Some((id, title)) = h.split_once(" — ") {
                out.push(BugInfo {
                    id: id.trim().to_string(),
                    title: title.trim().to_string(),
                    fix: None,
                    cves: Vec::new(),
                });
                ids_seen = false;
            }
            continue;
        }
        let (Some(b), Some(rest)) = (out.last_mut(), line.strip_prefix("- **Ids:**")) else {
            continue;
        };
        if ids_seen {
            continue;
        }
        ids_seen = true;
        for item in rest.split(';').map(str::trim).filter(|i| !i.is_empty()) {
            if let Some(f) = item.strip_prefix("fix ") {
                b.fix = Some(f.trim().to_string());
            } else if item.starts_with("CVE-") {
                b.cves.push(item.to_string());
            }
        }
    }
    out
}

impl BugInfo {
    /// `K1 · CVE-2019-3016 · fix 8c6de56a42e0`, as listings show it.
    pub fn label(&self) -> String {
        label(&self.id, &self.cves, self.fix.as_deref())
    }
}

/// A catalogued bug as listings name it, from its id, CVEs and fixing commit.
pub fn label(id: &str, cves: &[String], fix: Option<&str>) -> String {
    let mut parts = vec![id.to_string()];
    parts.extend(cves.iter().cloned());
    if let Some(f) = fix {
        parts.push(format!("fix {f}"));
    }
    parts.join(" · ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_has_its_fix_and_the_cves_of_its_heading() {
        let all = entries();
        assert!(all.len() >= 15, "{}", all.len());
        for b in all {
            assert!(b.fix.is_some(), "{}: no `- **Ids:** fix …` line", b.id);
            // A CVE named in the heading is on the Ids line too.
            for word in b
                .title
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            {
                if word.starts_with("CVE-") {
                    assert!(b.cves.iter().any(|c| c == word), "{}: {word}", b.id);
                }
            }
        }
        let k1 = lookup("K1").unwrap();
        assert_eq!(k1.label(), "K1 · CVE-2019-3016 · fix 8c6de56a42e0");
        assert!(lookup("Z9").is_none());
    }

    #[test]
    fn every_mutant_with_a_catalog_id_has_its_entry() {
        for (name, bug) in shootdown_linux::options::MUTANT_NAMES {
            if !bug.is_empty() {
                assert!(
                    lookup(bug).is_some(),
                    "mutant {name}: no catalog entry {bug}"
                );
            }
        }
    }

    #[test]
    fn parse_reads_headings_and_the_first_ids_line() {
        let doc = "## Entries\n\n### X1 — a bug (CVE-2020-1)\n\n- **Ids:** fix abc; CVE-2020-1\n\
                   - **Ids:** fix ignored\n\n### X2 — no ids\n\ntext\n";
        let got = parse(doc);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].fix.as_deref(), Some("abc"));
        assert_eq!(got[0].cves, vec!["CVE-2020-1".to_string()]);
        assert_eq!(got[1].fix, None);
    }
}
