//! SMM's address space under the explorer (`scenarios/kvm_smm.toml`, `kvm_smm_mmio.toml`): a
//! vCPU entering and leaving SMM around SMRAM against a normal-mode vCPU and a reclaim, in the
//! TDP MMU's form (the shadow MMU's, the scenario's own, is pinned in `verify.rs` and
//! `mutants.rs`), and the MMIO cache's generation in SMM.

mod common;
use common::run_set as run;

#[test]
fn the_tdp_mmu_form_verifies_and_its_mutants_are_found() {
    let tdp = ["options.tdp_mmu=true"];
    for (mm, states, transitions) in [("sc", 426692, 1180696), ("tso", 574053, 1750133)] {
        let r = run("kvm_smm", None, mm, &tdp);
        assert_eq!(
            (r.verdict.as_str(), r.states, r.transitions),
            ("verified", states, transitions),
            "{mm}"
        );
    }
    for (m, mm, steps, states) in [
        ("smm_change_keeps_root", "sc", 5, 39),
        ("smm_change_keeps_root", "tso", 5, 39),
        ("smm_fault_uses_as0", "sc", 20, 4380),
        ("smm_fault_uses_as0", "tso", 20, 5798),
    ] {
        let r = run("kvm_smm", Some(m), mm, &tdp);
        assert_eq!(r.invariant.as_deref(), Some("INV-ADDR-SPACE"), "{m} {mm}");
        assert_eq!(
            (r.counterexample.len(), r.states),
            (steps, states),
            "{m} {mm}"
        );
    }
    // The TDP MMU keeps a root per address space and never looks pages up by gfn: the shadow
    // MMU's role bug cannot happen there: the mutant is never reached.
    let r = run("kvm_smm", Some("sp_role_ignores_smm"), "sc", &tdp);
    assert_eq!((r.verdict.as_str(), r.states), ("unreached", 426692));
}

#[test]
fn each_mutant_breaks_the_address_space_where_it_should() {
    // Keeping the root: the first access in SMM hits the TLB entry filled through the normal
    // root. Looking up address space 0: SMM's root maps the normal frame. Ignoring the role:
    // kvm_mmu_load finds the normal root for SMM.
    for (m, says) in [
        (
            "smm_change_keeps_root",
            "hflags |= HF_SMM_MASK (no MMU reset)",
        ),
        (
            "smm_fault_uses_as0",
            "reached host frame 0x100200 for gfn 0x200, which only the normal address space's memslots map there",
        ),
        ("sp_role_ignores_smm", "SMM root = EPT page #0"),
    ] {
        let r = run("kvm_smm", Some(m), "sc", &[]);
        let all: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
        assert!(all.iter().any(|t| t.contains(says)), "{m}: {all:#?}");
    }
}

#[test]
fn the_mmio_cache_outlives_an_smm_memslot_update() {
    // The finding of kvm_smm_mmio (pinned with the others in mutants.rs): the story it tells.
    let r = run("kvm_smm_mmio", None, "sc", &[]);
    assert_eq!(r.invariant.as_deref(), Some("INV-MMIO"));
    let all: Vec<&str> = r.counterexample.iter().map(|s| s.text.as_str()).collect();
    for says in [
        "vcpu_cache_mmio_info(gfn 0x300, gen 0)",
        "MMIO SPTE for gfn 0x300 with generation 1",
        "rcu_assign_pointer(kvm->memslots[1], new slots)",
        "mmio_info_in_cache(gfn 0x300): hit (generation 0)",
    ] {
        assert!(all.iter().any(|t| t.contains(says)), "{says}: {all:#?}");
    }
}
