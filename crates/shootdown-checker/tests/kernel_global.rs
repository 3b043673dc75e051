//! Global kernel mappings (`scenarios/kernel_global.toml`): the INVLPG erratum of Alder and
//! Raptor Lake cores, and the kernel's answer to it (ce0b15d11ad8, v6.4: no PCIDs there).

use shootdown_checker::check;
use std::path::PathBuf;

fn run(sets: &[&str]) -> shootdown_checker::CheckResult {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/kernel_global.toml");
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    check(&path, None, "sc", None, None, 0, "bfs", true, &sets).unwrap()
}

#[test]
fn the_invlpg_erratum_leaves_a_global_entry_unless_pcids_stay_off() {
    // v6.4+: the erratum's CPUs run without PCIDs, and INVLPG flushes Global entries there.
    let r = run(&["features.invlpg_miss_global=true"]);
    assert_eq!((r.verdict.as_str(), r.states), ("verified", 315));
    // Before v6.4 the kernel used PCIDs on them: cpu1's INVLPG (from the IPI) leaves the
    // Global entry, and the kernel thread reads the unmapped page after vunmap_range returned.
    let r = run(&[
        "features.invlpg_miss_global=true",
        "options.invlpg_miss_global_no_pcid=false",
    ]);
    assert_eq!(r.invariant.as_deref(), Some("INV-STALE"));
    assert_eq!((r.counterexample.len(), r.states), (23, 476));
    let texts: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
    assert!(
        texts[12].contains("erratum: Global entries stay"),
        "{texts:?}"
    );
    assert!(texts[22].contains("Global TLB hit"), "{texts:?}");
}

#[test]
fn a_global_entry_serves_every_pcid() {
    // Without the Global bit's cross-PCID lookup the kernel thread (lazy on mm1) would miss;
    // with PCIDs off everything shares PCID 0: the same states either way.
    assert_eq!(run(&["options.pcid=false"]).states, 315);
    assert_eq!(run(&["options.lazy_tlb=tlb_gen"]).verdict, "verified");
}
