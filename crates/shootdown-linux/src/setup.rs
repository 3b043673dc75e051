//! Building a machine's initial state: the machine itself (every CPU idle in `init_mm`, natively
//! or as the vCPUs of a host's VMs), processes (`mm_alloc`), tasks, pre-faulted memory, DAX
//! files, and an aged ASID rotor. Workloads and checker scenarios call these before a run.

use crate::host::{Host, HostConfig, HostOp, HostThread};
use crate::kvm::memslot::Memslot;
use crate::kvm::mmu::fault::FaultTarget;
use crate::kvm::{mode, Kvm, VcpuRun, VcpuRunPc};
use crate::machine::Machine;
use crate::mem::MemoryModel;
use crate::options::Options;
use crate::perf::Perf;
use crate::state::*;
use shootdown_engine::{HashCached, Unhashed};
use shootdown_hw::oracle::Oracle;
use shootdown_hw::pagetable::{PtPages, Pte, Vpn};
use shootdown_hw::tlb::Tlb;
use shootdown_hw::{CostProfile, CpuId, Topology};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

impl Machine {
    /// A machine with every CPU idle in init_mm.
    pub fn new(
        topo: Topology,
        profile: Arc<CostProfile>,
        opts: Options,
        memory_model: MemoryModel,
    ) -> Machine {
        let n = topo.nr_cpus();
        Machine::with_cpus(topo, n, profile, opts, memory_model)
    }

    /// A machine of `n` CPUs on topology `topo` (`n` = the topology's CPUs natively; the vCPUs
    /// of every VM on a host, whose physical CPUs `topo` describes).
    pub(crate) fn with_cpus(
        topo: Topology,
        n: usize,
        profile: Arc<CostProfile>,
        opts: Options,
        memory_model: MemoryModel,
    ) -> Machine {
        let f = &profile.features;
        let opts_nmis = opts.perf_sample_hz.0 > 0;
        let mut m = Machine {
            pcid_hw: f.pcid,
            pti: f.pti,
            invpcid: f.invpcid,
            invlpg_miss_global: f.invlpg_miss_global,
            invlpgb: f.invlpgb,
            invlpgb_count_max: f.invlpgb_count_max,
            global_asids: Default::default(),
            opts,
            memory_model,
            cpus: Vec::with_capacity(n),
            tasks: Vec::new(),
            mms: vec![Mm::new(0, n, "init_mm".into()).into()],
            pt_pages: PtPages::default(),
            ept: Default::default(),
            oracle: HashCached::new(Oracle::new(1)),
            csd_locked: CsdLocks::new(n),
            flush_info: vec![None; n],
            cfd_func: vec![crate::smp::CallFunc::FlushTlb; n],
            spec_pages: Vec::new(),
            dax_files: Vec::new(),
            files: Vec::new(),
            pipes: Vec::new(),
            dax_index: BTreeMap::new(),
            fileio: None,
            next_pfn: crate::page_alloc::FIRST_PFN,
            free_frames: Default::default(),
            host: None,
            guest_words: Vec::new(),
            guest_word_pages: Vec::new(),
            kernel_locks: Vec::new(),
            page_lists: vec![Default::default(); n],
            latr: crate::latr::LatrStates::new(n),
            perf: Unhashed(Perf::new(profile.clone(), n, &topo)),
            nmis_possible: opts_nmis,
            topo,
        };
        for c in 0..n {
            let idle = m.tasks.len() as TaskId;
            m.tasks.push(HashCached::new(Task {
                state: TaskState::Running,
                cpus: Vec::new(),
                on_cpu: true,
                ..Task::new(format!("swapper/{c}"), None, c, Vec::new())
            }));
            m.cpus.push(HashCached::new(Cpu {
                tlb: Tlb::new(profile.features.tlb_entries, profile.features.psc_entries),
                cr3_mm: INIT_MM,
                cr3_pcid: 0,
                tlbstate: TlbState::default(),
                irq_stack: Vec::new(),
                irq_off: 0,
                ipi_pending: false,
                call_queue: Vec::new(),
                curr: idle,
                idle_task: idle,
                runqueue: Default::default(),
                need_resched: false,
                sb: Default::default(),
                halted: false,
                nmis_left: 0,
                nmi_vpn: None,
                invlpgb_pending: Vec::new(),
            }));
        }
        m.add_kernel_page_locks(1);
        m.init_nmi_schedule();
        for c in 0..n {
            m.perf.cpu[c].next_tick = crate::latr::TICK;
        }
        m
    }

    /// A machine whose CPUs are the vCPUs of `cfg.vms` VMs on a host with topology `topo`
    /// (the pCPUs). Call `cfg.validate(topo.nr_cpus())` first.
    pub fn with_host(
        topo: Topology,
        profile: Arc<CostProfile>,
        opts: Options,
        memory_model: MemoryModel,
        cfg: HostConfig,
    ) -> Machine {
        let pcpus = topo.nr_cpus();
        let n = cfg.vms * cfg.vcpus_per_vm;
        let mut m = Machine::with_cpus(topo, n, profile, opts, memory_model);
        let vms = cfg.vms;
        m.host = Some(Box::new(Host::new(cfg, pcpus)));
        // One guest kernel per VM, each with its own page lists' locks.
        m.add_kernel_page_locks(vms - 1);
        // With the host's scheduling timers.
        m.perf = Unhashed(m.blank_perf());
        m
    }

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
            .push(Mm::new(id as u64 + 1, self.cpus.len(), name.to_string()).into());
        self.oracle.add_mm();
        id
    }

    /// Create a user task on `cpu`, runnable.
    pub fn add_task(&mut self, name: &str, mm: MmId, cpu: CpuId, program: Vec<UserOp>) -> TaskId {
        self.add_task_of(name, Some(mm), cpu, program)
    }

    /// A user task the run does not wait for: the run ends when every other task has exited,
    /// whatever this one is doing (a sibling that reads memory in a loop forever, or sleeps in
    /// [`UserOp::Pause`]). Its program must not exit.
    pub fn add_background_task(
        &mut self,
        name: &str,
        mm: MmId,
        cpu: CpuId,
        program: Vec<UserOp>,
    ) -> TaskId {
        assert!(
            !program.contains(&UserOp::Exit),
            "a background task never exits (the run does not count it)"
        );
        let id = self.add_task_of(name, Some(mm), cpu, program);
        self.perf.user_tasks_alive -= 1;
        id
    }

    /// A kernel thread (no mm of its own: it runs lazily on whatever mm is loaded), such as
    /// khugepaged; its program may use only kernel ops ([`UserOp::Collapse`]), `Compute`,
    /// `Loop` and `Exit`.
    pub fn add_kthread(&mut self, name: &str, cpu: CpuId, program: Vec<UserOp>) -> TaskId {
        self.add_task_of(name, None, cpu, program)
    }

    fn add_task_of(
        &mut self,
        name: &str,
        mm: Option<MmId>,
        cpu: CpuId,
        program: Vec<UserOp>,
    ) -> TaskId {
        let id = self.tasks.len() as TaskId;
        self.tasks.push(HashCached::new(Task::new(
            name.to_string(),
            mm,
            cpu,
            program,
        )));
        if let Some(mm) = mm.filter(|&m| m != INIT_MM) {
            self.mms[mm as usize].mm_users += 1;
        }
        if self.opts.sched == crate::options::Sched::Eevdf {
            self.eevdf_place_new(cpu, id);
        }
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
        // Frames of the mm's own (`page_alloc.rs`); a VM with a KVM MMU keeps gfn = vpn, the
        // numbers its memslots describe guest-physical memory by.
        let base = if self.has_any_kvm_mmu() {
            None
        } else {
            Some(self.alloc_frames(npages))
        };
        let pte_at = |old: Option<&Pte>, vpn: Vpn| Pte {
            present: true,
            writable,
            pfn: match base {
                Some(b) => b + (vpn - start) as u32,
                None => (vpn & 0xffff_ffff) as u32,
            },
            ..old.copied().unwrap_or(Pte::NONE)
        };
        // A fresh page-table page's entries are built in one pass (set-up maps up to millions
        // of pages), an existing entry keeps its version history.
        self.mms[mm as usize]
            .space
            .ptes
            .map_range(start..end, pte_at);
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

    /// Allocate the page-table page covering `vpn` if the PMD has none; whether it did.
    pub(crate) fn ensure_table(&mut self, mm: MmId, vpn: Vpn) -> bool {
        let idx = shootdown_hw::pagetable::pt_index(vpn);
        if self.mms[mm as usize].space.pmd.contains_key(&idx) {
            return false;
        }
        let t = self.pt_pages.alloc();
        self.mms[mm as usize].space.pmd.insert(idx, t);
        true
    }

    /// Model VM `vm`'s MMU: memslots `slots` in address space 0, an EPT the vCPUs fill by
    /// faulting, `mmu_lock`, SRCU, requests. Its running vCPUs start in `vcpu_run` outside the
    /// guest (they load a root before their first entry). Machines with a host only.
    pub fn enable_kvm_mmu(&mut self, vm: usize, slots: Vec<Memslot>) {
        let vcpus = self.host_ref().vm_cpus(vm);
        while self.oracle.nr_vms() <= vm {
            self.oracle.add_vm();
        }
        // vmx hardware_setup(): no EPT A/D bits (nor PML) without EPT.
        if !self.opts.ept {
            self.opts.ept_ad = false;
            self.opts.pml = false;
        }
        let all_set = self.opts.dirty_log_initially_set;
        self.host_mut().kvms[vm] = Some(Kvm::new(slots, vcpus.clone(), all_set)).into();
        for v in vcpus {
            let vc = &mut self.host_mut().vcpus[v];
            vc.mode = mode::OUTSIDE_GUEST_MODE;
            if vc.stack.is_empty() {
                vc.stack.push(crate::frame::Frame::VcpuRun(VcpuRun {
                    pc: VcpuRunPc::Requests,
                    exit: crate::kvm::Exit::Preempted,
                }));
                vc.srcu = 1;
            }
        }
    }

    /// Give VM `vm` SMM's address space with memslots `slots` (`kvm/smm.rs`).
    pub fn enable_smm(&mut self, vm: usize, slots: Vec<Memslot>) {
        let all_set = self.opts.dirty_log_initially_set;
        self.kvm_mut(vm).enable_smm(slots, all_set);
    }

    /// The steal-time areas of VM `vm`'s vCPUs: vCPU i's at guest frame `base + i`, as if
    /// each had written `MSR_KVM_STEAL_TIME` at boot (`kvm/st_cache.rs`).
    pub fn set_steal_time_gfns(&mut self, vm: usize, base: u64) {
        for (i, v) in self.host_ref().vm_cpus(vm).enumerate() {
            self.host_mut().vcpus[v].st_gfn = Some(base + i as u64);
        }
    }

    /// Say whether VM `vm` has non-coherent DMA (an assigned device without snoop control), so
    /// that KVM honours its memory types (seed 004).
    pub fn set_noncoherent_dma(&mut self, vm: usize, on: bool) {
        self.kvm_mut(vm).noncoherent_dma = on;
    }

    /// The guest memory-type state of VM `vm` when a run starts: non-coherent DMA, and every
    /// vCPU's MTRRs and CR0.CD.
    pub fn set_guest_memtypes(
        &mut self,
        vm: usize,
        noncoherent: bool,
        mtrrs: crate::kvm::mtrr::MtrrState,
        cr0_cd: bool,
    ) {
        self.kvm_mut(vm).noncoherent_dma = noncoherent;
        for v in self.host_ref().vm_cpus(vm) {
            let vc = &mut self.host_mut().vcpus[v];
            vc.mtrr = mtrrs;
            vc.cr0_cd = cr0_cd;
        }
    }

    /// `tdp_mmu_max_gfn_exclusive()` of VM `vm` (the host's physical-address width).
    pub fn set_tdp_max_gfn(&mut self, vm: usize, max_gfn: u64) {
        self.kvm_mut(vm).max_gfn = max_gfn;
    }

    /// A TDP MMU root of address space `as_id` (2nd one: SMM) for VM `vm`, as if a vCPU had
    /// entered that mode before the run.
    pub fn add_tdp_root(&mut self, vm: usize, as_id: u8) {
        let mut env = crate::describe::NullEnv;
        self.kvm_tdp_mmu_get_vcpu_root(vm, as_id, &mut env);
    }

    /// Populate VM `vm`'s EPT for guest frames `[start, start + npages)` as faults would have
    /// (memory the guest touched before the run): the shared direct root and its tables, 2 MiB
    /// leaves where the memslot allows them.
    pub fn prefault_ept(&mut self, vm: usize, start: u64, npages: u64) {
        let mut env = crate::describe::NullEnv;
        self.prefault_marks_dirty(vm, start, npages);
        if self.opts.tdp_mmu {
            self.tdp_prefault(vm, start, npages, &mut env);
            self.kvm_mut(vm).mmu.last_zap = 0;
            self.perf.counters = crate::counters::Counters::new();
            return;
        }
        let root = self.kvm_mmu_get_page(vm, 0, shootdown_hw::ept::EPT_ROOT_LEVEL, 0, &mut env);
        let mut gfn = start;
        while gfn < start + npages {
            let target = self.fault_target(vm, 0, gfn, false);
            let step = match target {
                FaultTarget::Ram { level: 2, .. } => shootdown_hw::ept::gfns_per_entry(2),
                _ => 1,
            };
            if !matches!(target, FaultTarget::Ram { .. }) {
                gfn += 1;
                continue;
            }
            let _ = self.map_gfn(vm, root, gfn, target, None, 0, &mut env);
            gfn = gfn / step * step + step;
        }
        self.kvm_mut(vm).mmu.last_zap = 0;
        self.perf.counters = crate::counters::Counters::new();
    }

    /// The prefault's writable SPTEs of slots that log dirty pages mark their gfns, as the
    /// faults' `make_spte()` would have (the VMM has not harvested them yet).
    fn prefault_marks_dirty(&mut self, vm: usize, start: u64, npages: u64) {
        use crate::kvm::dirty_log::{bit_of, slot_key};
        let k = self.kvm_mut(vm);
        for as_id in 0..k.address_spaces.len() {
            let slots = k.address_spaces[as_id].active_set().slots.clone();
            for sl in slots.iter().filter(|sl| sl.dirty_log && !sl.readonly) {
                let key = slot_key(as_id as u8, sl.id);
                for gfn in start.max(sl.base_gfn)..(start + npages).min(sl.end()) {
                    let (w, b) = bit_of(gfn - sl.base_gfn);
                    let x = k.dirty_log.word(key, w) | b;
                    k.dirty_log.set_word(key, w, x);
                }
            }
        }
    }

    /// Add a host thread (the VMM's, or one that invalidates guest memory) working for VM `vm`
    /// on pCPU `pcpu`. Machines with a host only. Returns its agent index.
    pub fn add_host_thread(
        &mut self,
        name: &str,
        vm: usize,
        pcpu: usize,
        program: Vec<HostOp>,
    ) -> usize {
        let n = self.cpus.len();
        let h = self.host_mut();
        h.threads
            .push(HostThread::new(name, vm as u32, pcpu as u32, program).into());
        let a = n + h.threads.len() - 1;
        self.perf.host_threads_alive += 1;
        a
    }
}
