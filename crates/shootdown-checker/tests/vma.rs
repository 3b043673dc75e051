//! VMAs and the calls that move or revoke mappings under the explorer
//! (`scenarios/mremap_truncate.toml`, `migrate_vma_madvise.toml`, `pfnmap_revoke.toml`): the
//! kernel's forms before and after eb66ae030829 (mremap, CVE-2018-18281) and 60bae7370896
//! (migrate_vma, 2022).

mod common;
use common::run_set as run;
use std::path::PathBuf;

/// Scenario `base` with operation `from` replaced by `to`, written as `name` in a temporary
/// directory.
fn variant(base: &str, from: &str, to: &str, name: &str) -> PathBuf {
    let text = std::fs::read_to_string(common::scenario(base)).unwrap();
    assert!(text.contains(from), "{base} has no {from}");
    let dir = std::env::temp_dir().join(format!("shootdown-vma-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text.replace(from, to)).unwrap();
    path
}

#[test]
fn before_v4_19_mremap_lets_truncate_free_a_page_another_cpu_caches() {
    // CVE-2018-18281: move_ptes drops the PTLs with the clean PTE's flush deferred; the
    // truncate zaps the PTE at its new address, flushes that, and frees the page.
    for (mm, steps, states) in [("sc", 38, 15815), ("tso", 40, 22092)] {
        let r = run(
            "mremap_truncate",
            None,
            mm,
            &["options.mremap_tlb_flush=v4_18"],
        );
        assert_eq!(r.invariant.as_deref(), Some("INV-FREEPAGE"), "{mm}");
        assert_eq!((r.counterexample.len(), r.states), (steps, states), "{mm}");
        let texts: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
        assert!(
            texts
                .iter()
                .any(|t| t.contains("*need_flush = true; drop the PTLs unflushed")),
            "{texts:?}"
        );
        assert!(
            texts
                .last()
                .unwrap()
                .contains("truncate_inode_pages('data')"),
            "{texts:?}"
        );
    }
}

#[test]
fn before_the_fix_madvise_returns_over_a_migration_entry_unflushed() {
    for (mm, steps, states) in [("sc", 10, 67), ("tso", 11, 93)] {
        let r = run(
            "migrate_vma_madvise",
            None,
            mm,
            &["options.migrate_vma_flush=v5_18"],
        );
        assert_eq!(r.invariant.as_deref(), Some("INV-SYSRET"), "{mm}");
        assert_eq!((r.counterexample.len(), r.states), (steps, states), "{mm}");
        let texts: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
        assert!(
            texts
                .iter()
                .any(|t| t.contains("pte_unmap_unlock; then flush_tlb_range")),
            "{texts:?}"
        );
        assert!(
            texts.iter().any(|t| t.contains("zap 0 PTEs of mm1")),
            "{texts:?}"
        );
    }
}

#[test]
fn a_truncate_racing_a_munmap_of_the_page_waits_for_its_flush() {
    // The munmap's mmu_gather holds the page until its flush: the truncate may not free it
    // first (and its own zap, finding nothing, flushes anyway while the munmap's is pending).
    let path = variant(
        "mremap_truncate",
        "{ mremap = { start = 0x10, npages = 1, new_start = 0x30 } }",
        "{ munmap = { start = 0x10, npages = 1 } }",
        "munmap_truncate",
    );
    for mm in ["sc", "tso"] {
        let r = shootdown_checker::check(&path, None, mm, None, None, 0, "bfs", true, &[]).unwrap();
        assert_eq!(r.verdict, "verified", "{mm}: {:?}", r.counterexample.last());
    }
}

#[test]
fn mremap_flushes_reclaims_pending_batch_before_moving() {
    // reclaim_madvise with an mremap in place of the madvise: move_ptes finds the PTE reclaim
    // cleared, moves nothing, and only its flush_tlb_batched_pending() makes it flush before it
    // returns (A3, 3ea277194daa, names mremap among the calls it covers).
    let path = variant(
        "reclaim_madvise",
        "{ madvise_dontneed = { start = 0x10, npages = 1 } }",
        "{ mremap = { start = 0x10, npages = 1, new_start = 0x30 } }",
        "reclaim_mremap",
    );
    let check = |mutant| {
        shootdown_checker::check(&path, mutant, "sc", None, None, 0, "bfs", true, &[]).unwrap()
    };
    assert_eq!(check(None).verdict, "verified");
    let r = check(Some("no_flush_tlb_batched_pending"));
    assert_eq!(r.invariant.as_deref(), Some("INV-SYSRET"));
    assert!(
        r.counterexample
            .iter()
            .any(|s| s.text.contains("move_ptes: 0 PTE(s)")),
        "{:?}",
        r.counterexample
    );
}
