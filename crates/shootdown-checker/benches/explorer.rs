//! Explorer throughput: exhaustive exploration of three fixed scenarios (`flush_catchup` TSO,
//! 47,991 states; `madvise_nested` SC, 102,861; `thp_zap` TSO, 16,831). Reports states/s and bytes per stored state (printed once before the
//! criterion runs): `cargo bench -p shootdown-checker --bench explorer`.
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use shootdown_checker::explore::{explore, Limits};
use shootdown_checker::reduce::MachineReduction;
use shootdown_checker::Scenario;
use shootdown_linux::MemoryModel;
use std::path::Path;

fn bench(c: &mut Criterion) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/flush_catchup.toml");
    let sc = Scenario::load(&path).expect("scenario");
    let init = sc.build(None, MemoryModel::Tso).expect("build");
    let red = MachineReduction::new(&sc, false);
    let ex = explore(&init, &red, Limits::default());
    let machine_bytes = std::mem::size_of_val(&init);
    println!(
        "flush_catchup (tso): {} states, {} transitions, {:.3} s => {:.0} states/s, {:.0} transitions/s; \
         index {} B = {:.1} B/state (visited fingerprint + parent pointer); peak frontier {} states \
         (each a full Machine, {} B inline + heap)",
        ex.states,
        ex.transitions,
        ex.seconds,
        ex.states as f64 / ex.seconds,
        ex.transitions as f64 / ex.seconds,
        ex.index_bytes,
        ex.index_bytes as f64 / ex.states as f64,
        ex.peak_frontier,
        machine_bytes
    );
    let mut g = c.benchmark_group("explorer");
    g.sample_size(10);
    g.throughput(Throughput::Elements(ex.states));
    g.bench_function("flush_catchup_tso_exhaustive", |b| {
        b.iter(|| {
            let ex = explore(&init, &red, Limits::default());
            assert_eq!(ex.states, 47_991);
        })
    });
    for (name, model, states) in [
        ("madvise_nested", MemoryModel::Sc, 102_861),
        ("thp_zap", MemoryModel::Tso, 16_831),
    ] {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../scenarios/{name}.toml"));
        let sc = Scenario::load(&path).expect("scenario");
        let init = sc.build(None, model).expect("build");
        let red = MachineReduction::new(&sc, false);
        g.throughput(Throughput::Elements(states));
        g.bench_function(format!("{name}_{model:?}_exhaustive").to_lowercase(), |b| {
            b.iter(|| {
                let ex = explore(&init, &red, Limits::default());
                assert_eq!(ex.states, states);
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
