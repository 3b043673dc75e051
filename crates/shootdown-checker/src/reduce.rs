//! The reductions the explorer applies to `shootdown_linux::Machine`.
//!
//! **Partial-order reduction.** In a state where some CPU's next `Step` is *local*
//! ([`Machine::step_is_local`]: interrupts off, touches only that CPU's private state, never the
//! TLB, page tables or oracle, never spins), `{Step(cpu)}` is a persistent set: no sequence of
//! other actions can enable an action that conflicts with it, and it cannot report a violation.
//! The explorer then expands only that action (if its successor is new; see `explore.rs` for the
//! cycle proviso). The lowest such CPU is chosen, so the choice is deterministic.
//!
//! **Symmetry reduction.** A scenario may declare groups of interchangeable CPUs (same tasks,
//! same programs, no setup steps). The fingerprint of a state is then the smallest fingerprint
//! over all renamings of the CPUs inside each group ([`Machine::permute_cpus`], which also
//! renames their tasks, cpumask bits, csds, store-buffer locations…). See `docs/checker.md` for
//! the one place where the model is not fully rename-invariant and how that is checked.

use crate::explore::{fingerprint, Reduction};
use crate::scenario::Scenario;
use shootdown_linux::{Action, Machine};

pub struct MachineReduction {
    /// Every (cpu permutation, task permutation) of the declared groups except the identity.
    perms: Vec<(Vec<usize>, Vec<u32>)>,
}

fn permutations(items: &[usize]) -> Vec<Vec<usize>> {
    if items.len() <= 1 {
        return vec![items.to_vec()];
    }
    let mut out = Vec::new();
    for i in 0..items.len() {
        let mut rest = items.to_vec();
        let x = rest.remove(i);
        for mut p in permutations(&rest) {
            p.insert(0, x);
            out.push(p);
        }
    }
    out
}

impl MachineReduction {
    pub fn new(sc: &Scenario, symmetry: bool) -> Self {
        let mut perms = Vec::new();
        if symmetry && !sc.symmetric_groups().is_empty() {
            let n = sc.file.cpus;
            let tasks = sc.tasks_of_cpu();
            let nt = n + sc.file.tasks.len();
            // Cartesian product of the permutations of each group.
            let mut cpu_perms: Vec<Vec<usize>> = vec![(0..n).collect()];
            for g in sc.symmetric_groups() {
                let mut next = Vec::new();
                for base in &cpu_perms {
                    for p in permutations(g) {
                        let mut q = base.clone();
                        for (k, &c) in g.iter().enumerate() {
                            q[c] = p[k];
                        }
                        next.push(q);
                    }
                }
                cpu_perms = next;
            }
            for cp in cpu_perms {
                if cp.iter().enumerate().all(|(i, &c)| i == c) {
                    continue;
                }
                let mut tp: Vec<u32> = (0..nt as u32).collect();
                for c in 0..n {
                    tp[c] = cp[c] as u32; // idle task c is task c
                    for (k, &t) in tasks[c].iter().enumerate() {
                        tp[t as usize] = tasks[cp[c]][k];
                    }
                }
                perms.push((cp, tp));
            }
        }
        MachineReduction { perms }
    }

    /// Whether symmetry is in effect.
    pub fn symmetric(&self) -> bool {
        !self.perms.is_empty()
    }
}

impl Reduction<Machine> for MachineReduction {
    fn fingerprint(&self, m: &Machine) -> u128 {
        let mut best = fingerprint(m);
        for (cp, tp) in &self.perms {
            best = best.min(fingerprint(&m.permute_cpus(cp, tp)));
        }
        best
    }

    fn persistent_singleton(&self, m: &Machine, enabled: &[Action]) -> Option<Action> {
        enabled.iter().copied().find(|&a| match a {
            Action::Step(c) => m.step_is_local(c as usize),
            _ => false,
        })
    }
}
