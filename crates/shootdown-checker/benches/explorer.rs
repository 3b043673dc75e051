//! Explorer throughput on the scenarios issue 16 names, with the two searches `shootdown check`
//! runs by default (depth-first on every core to verify, [`explore_dfs`]; breadth-first on
//! every core for a shortest counterexample, [`explore_parallel`]) and the allocator the
//! shipped binaries use (mimalloc): `flush_catchup` under TSO, `pv_tlb_flush_3vcpu` under SC
//! and `smp_call_concurrent` under TSO; and the one-thread breadth-first search on
//! `flush_catchup` for comparison. Each case prints its states, seconds, states/s and index
//! bytes per state once before criterion times it:
//! `cargo bench -p shootdown-checker --bench explorer`.
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use shootdown_checker::dfs::explore_dfs;
use shootdown_checker::explore::{explore, Limits};
use shootdown_checker::parallel::explore_parallel;
use shootdown_checker::reduce::MachineReduction;
use shootdown_checker::Scenario;
use shootdown_linux::MemoryModel;
use std::path::Path;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A scenario, its memory model, and the states the full search visits, breadth-first and
/// depth-first (pinned, so that a bench that stopped exploring what it should fails instead
/// of getting faster; the two provisos of partial-order reduction may keep different states).
const CASES: [(&str, MemoryModel, u64, u64); 3] = [
    ("flush_catchup", MemoryModel::Tso, 36_208, 36_208),
    ("pv_tlb_flush_3vcpu", MemoryModel::Sc, 439_930, 439_930),
    ("smp_call_concurrent", MemoryModel::Tso, 920_860, 920_860),
];

fn bench(c: &mut Criterion) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut g = c.benchmark_group("explorer");
    g.sample_size(10);
    for (name, model, states, dfs_states) in CASES {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../scenarios/{name}.toml"));
        let sc = Scenario::load(&path).expect("scenario");
        let init = sc.build(None, model).expect("build");
        let red = MachineReduction::new(&sc, true);
        let search = |dfs: bool| {
            if dfs {
                explore_dfs(&init, &red, Limits::default(), threads).ex
            } else {
                explore_parallel(&init, &red, Limits::default(), threads)
            }
        };
        for (kind, dfs, pinned) in [("dfs", true, dfs_states), ("parallel", false, states)] {
            let ex = search(dfs);
            assert_eq!(ex.states, pinned, "{name} {kind}");
            println!(
                "{name} ({model:?}, {kind}, {threads} threads): {} states, {} transitions, \
                 {:.3} s => {:.0} states/s; index {:.1} B/state; {}",
                ex.states,
                ex.transitions,
                ex.seconds,
                ex.states as f64 / ex.seconds,
                ex.index_bytes as f64 / ex.states as f64,
                if dfs {
                    format!("deepest path {}", ex.depth)
                } else {
                    format!("widest level {} states", ex.peak_frontier)
                },
            );
            g.throughput(Throughput::Elements(pinned));
            g.bench_function(format!("{name}_{model:?}_{kind}").to_lowercase(), |b| {
                b.iter(|| assert_eq!(search(dfs).states, pinned))
            });
        }
    }
    // The sequential breadth-first search (its partial-order reduction's proviso sees the
    // states visited so far, so it keeps a few more states than the parallel one).
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/flush_catchup.toml");
    let sc = Scenario::load(&path).expect("scenario");
    let init = sc.build(None, MemoryModel::Tso).expect("build");
    let red = MachineReduction::new(&sc, true);
    let states = explore(&init, &red, Limits::default()).states;
    g.throughput(Throughput::Elements(states));
    g.bench_function("flush_catchup_tso_bfs_one_thread", |b| {
        b.iter(|| {
            let ex = explore(&init, &red, Limits::default());
            assert_eq!(ex.states, states);
        })
    });
    g.finish();
}

criterion_group!(explorer_benches, bench);
criterion_main!(explorer_benches);
