//! Building a machine's initial state: processes (`mm_alloc`), tasks, pre-faulted memory, DAX
//! files, and an aged ASID rotor. Workloads and checker scenarios call these before a run.

use crate::machine::Machine;
use crate::state::*;
use shootdown_hw::pagetable::{Pte, Vpn};
use shootdown_hw::CpuId;
use std::collections::{BTreeMap, BTreeSet};

impl Machine {
    /// A machine that has been up a while: other processes have run on every CPU since boot,
    /// so each CPU's `cpu_tlbstate.next_asid` rotor (`choose_new_asid`) stands anywhere in
    /// `0..TLB_NR_DYN_ASIDS`, drawn uniformly from `seed`. A workload's mm then gets a
    /// different `ctxs[]` slot on different CPUs — which matters for cost, since `ctxs[0..2]`
    /// share a cache line with `is_lazy` before v5.13 (`mem::tlbstate_ctx_line`). A fresh
    /// machine (the checker's) hands the first user mm ASID 1 everywhere.
    pub fn age_asid_rotors(&mut self, seed: u64) {
        let mut rng = shootdown_engine::rng::DetRng::new(seed, 0xa51d);
        for c in &mut self.cpus {
            c.tlbstate.next_asid = rng.below(TLB_NR_DYN_ASIDS as u64) as u16;
        }
    }

    /// Create a process address space (`mm_alloc`); `ctx_id`s are never reused.
    pub fn add_mm(&mut self, name: &str) -> MmId {
        let id = self.mms.len() as MmId;
        self.mms
            .push(Mm::new(id as u64 + 1, self.cpus.len(), name.to_string()));
        self.oracle.add_mm();
        id
    }

    /// Create a user task on `cpu`, runnable.
    pub fn add_task(&mut self, name: &str, mm: MmId, cpu: CpuId, program: Vec<UserOp>) -> TaskId {
        let id = self.tasks.len() as TaskId;
        self.tasks.push(Task {
            name: name.to_string(),
            mm: Some(mm),
            state: TaskState::Runnable,
            cpu,
            stack: Vec::new(),
            program,
            pc: 0,
            loop_left: Vec::new(),
            op_progress: 0,
            op_base: None,
            fsync_file: None,
            cpus: vec![cpu],
            on_cpu: false,
        });
        self.cpus[cpu].runqueue.push_back(id);
        self.cpus[cpu].need_resched = true;
        self.perf.user_tasks_alive += 1;
        id
    }

    /// Populate PTEs directly (pre-faulted memory), creating page-table pages as needed.
    pub fn map_pages(&mut self, mm: MmId, start: Vpn, npages: u64, writable: bool) {
        if npages == 0 {
            return;
        }
        let end = start + npages;
        // One page-table page per 512-page group: allocate each once, not once per page.
        let mut vpn = start;
        while vpn < end {
            self.ensure_table(mm, vpn);
            vpn = (vpn / 512 + 1) * 512;
        }
        let pte_at = |old: Option<&Pte>, vpn: Vpn| Pte {
            present: true,
            writable,
            pfn: (vpn & 0xffff_ffff) as u32,
            ..old.copied().unwrap_or(Pte::NONE)
        };
        let ptes = &mut self.mms[mm as usize].space.ptes;
        if ptes.range(start..end).next().is_none() {
            // Fresh range (workload set-up maps up to millions of pages): build the new entries
            // as a tree in one pass and merge it, instead of one insertion per page.
            let mut fresh: BTreeMap<Vpn, Pte> =
                (start..end).map(|v| (v, pte_at(None, v))).collect();
            ptes.append(&mut fresh);
        } else {
            for vpn in start..end {
                let pte = pte_at(ptes.get(&vpn), vpn);
                ptes.insert(vpn, pte);
            }
        }
    }

    /// Map a file of a DAX filesystem at `[start, start+npages)` of `mm` (write faults mark
    /// entries dirty, fdatasync writes them back). Returns the file's index.
    pub fn add_dax_file(&mut self, mm: MmId, start: Vpn, npages: u64) -> u32 {
        let id = self.dax_files.len() as u32;
        self.dax_files.push(DaxFile {
            mm,
            start,
            npages,
            dirty: BTreeSet::new(),
            xa_lock: 0,
        });
        self.dax_index.insert((mm, start), id);
        id
    }

    /// The DAX file of `mm` that maps `vpn`, if any.
    pub(crate) fn dax_file_of(&self, mm: MmId, vpn: Vpn) -> Option<u32> {
        let (_, &id) = self.dax_index.range(..=(mm, vpn)).next_back()?;
        let f = &self.dax_files[id as usize];
        (f.mm == mm && vpn < f.start + f.npages).then_some(id)
    }

    /// Allocate the page-table page covering `vpn` if the PMD has none.
    pub(crate) fn ensure_table(&mut self, mm: MmId, vpn: Vpn) {
        let idx = shootdown_hw::pagetable::pt_index(vpn);
        if !self.mms[mm as usize].space.pmd.contains_key(&idx) {
            let t = self.pt_pages.alloc();
            self.mms[mm as usize].space.pmd.insert(idx, t);
        }
    }
}
