//! Seed 004 from the model: the zap requests of every vCPU's boot script equal the published
//! "zap cnt" in all 32 cells (no fitted constant is involved: they follow from the scripts and
//! the trigger rules), and the zap cycles keep the orderings the seed shows.
use shootdown_experiments::{load, run_points, Experiment};
use std::collections::BTreeMap;
use std::path::Path;

const ZAP_CNT: &str = "kvm.mtrr_zap_requests";

fn experiment(name: &str) -> Experiment {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../experiments/seeds/{name}.toml"));
    load(&path, &[]).unwrap()
}

/// (vcpus, variant) → (zap cycles, zap cnt) of every point of the full experiment.
fn run(e: &Experiment) -> BTreeMap<(u64, String), (f64, u64)> {
    let idx: Vec<usize> = (0..e.points(false).len()).collect();
    run_points(e, false, &idx, 0)
        .unwrap()
        .into_iter()
        .map(|r| {
            assert_eq!(r.stop, "finished", "{r:?}");
            assert!(r.violations.is_empty(), "{:?}", r.violations);
            let cnt = r.counters[ZAP_CNT];
            ((r.row.as_u64().unwrap(), r.variant), (r.value, cnt))
        })
        .collect()
}

#[test]
fn zap_counts_equal_the_published_ones_and_cycles_keep_the_seeds_orderings() {
    let mut cycles = BTreeMap::new();
    for name in ["seed004-ovmf", "seed004-seabios"] {
        let e = experiment(name);
        let got = run(&e);
        let mut cells = 0;
        for p in &e.published {
            let key = (p.row.as_u64().unwrap(), p.variant.clone());
            let want = p.counters[ZAP_CNT];
            assert_eq!(got[&key].1 as f64, want, "{name} {key:?}");
            cells += 1;
        }
        assert_eq!(cells, 16, "{name}");
        for vcpus in [8, 16] {
            let c = |v: &str| got[&(vcpus, v.to_string())].0;
            // Mainline no longer virtualizes guest MTRRs: no requests, no cycles.
            assert_eq!(got[&(vcpus, "mainline".into())], (0.0, 0), "{name}");
            // Base2 > Base1; each of patches 9, 10, 11 lowers the cycles.
            assert!(c("base2") > c("base1"), "{name} {vcpus}");
            assert!(c("p9") < c("base2"), "{name} {vcpus}");
            assert!(c("p9_10") < c("p9"), "{name} {vcpus}");
            assert!(c("p9_10_11") < c("p9_10"), "{name} {vcpus}");
            assert!(c("p9_10_11_12") < c("p9_10_11"), "{name} {vcpus}");
            assert!(c("p12") < c("base2") / 10.0, "{name} {vcpus}");
            cycles.insert((name, vcpus), got.clone());
        }
        // Patch 12 flattens the growth from 8 to 16 vCPUs.
        let growth = |v: &str| got[&(16, v.to_string())].0 / got[&(8, v.to_string())].0;
        assert!(growth("p12") < growth("base2") / 1.5, "{name}");
        assert!(growth("p12") < 3.0, "{name}");
    }
    // OVMF's concurrent AP sequences cost more than SeaBIOS's serialized ones.
    for vcpus in [8, 16] {
        for v in ["base1", "base2", "p9", "p12"] {
            let key = (vcpus, v.to_string());
            let ovmf = cycles[&("seed004-ovmf", vcpus)][&key].0;
            let seabios = cycles[&("seed004-seabios", vcpus)][&key].0;
            assert!(ovmf > seabios, "{v} {vcpus}: {ovmf} vs {seabios}");
        }
    }
}

#[test]
fn the_fitted_cell_is_marked_and_reproduced() {
    let e = experiment("seed004-ovmf");
    let fitted: Vec<_> = e
        .published
        .iter()
        .filter(|p| !p.fitted.is_empty())
        .collect();
    assert_eq!(fitted.len(), 1);
    assert_eq!(
        (fitted[0].variant.as_str(), fitted[0].row.as_u64()),
        ("p12", Some(8))
    );
    assert_eq!(fitted[0].fitted, vec!["tdp_iter_step".to_string()]);
    let idx: Vec<usize> = e
        .points(false)
        .iter()
        .filter(|p| p.variant == "p12" && p.row.as_u64() == Some(8))
        .map(|p| p.index)
        .collect();
    let r = &run_points(&e, false, &idx, 1).unwrap()[0];
    assert!((r.value / 32.66 - 1.0).abs() < 0.1, "{}", r.value);
}
