//! VMAs and the files behind them, as far as translation coherence needs them: mm/mmap.c's
//! `vma_link` / `__split_vma` / `unlink_file_vma`, mm/interval_tree.c's `i_mmap`,
//! mm/filemap.c's `filemap_fault`, and a driver's `remap_pfn_range` (VM_PFNMAP).
//!
//! * A [`File`] is an inode with its `struct address_space`: its size (`i_size`, in pages), its
//!   page cache (`i_pages`: page offset → frame) and `i_mmap`, the VMAs that map it in rmap
//!   traversal order, guarded by `i_mmap_rwsem`. A *device* file has no page cache: its mmap is
//!   VM_PFNMAP | VM_IO, the driver's `remap_pfn_range` of device memory (frames the allocator
//!   never owns), as vfio-pci maps a BAR; `size` is then how many pages its fault handler
//!   serves (0 once the driver revoked the mapping).
//! * A [`Vma`] maps `npages` pages of a file from page offset `pgoff`, MAP_SHARED or
//!   MAP_PRIVATE (whose written pages are anonymous copies, `syscalls.rs`'s COW). Anonymous
//!   memory has no VMA here: an address no file VMA covers is anonymous, and a fault there maps
//!   a fresh frame (the model never raises SIGSEGV).
//! * Page-cache frames are shared on purpose: every mm that maps a file page maps the same
//!   frame. A zap drops only the mapping's reference; the frame goes back to the allocator
//!   (`INV-FREEPAGE` checked) once it has left the page cache and no PTE maps it, whichever
//!   comes last — the page's reference count, without counting.
//!
//! `i_mmap` is an interval tree keyed by `vm_pgoff` whose insertion puts a VMA after those
//! with an equal key (`vma_interval_tree_insert`); its in-order walk is the rmap traversal
//! order `move_ptes()` relies on when `need_rmap_locks` is false (`mremap.rs`).
//!
//! Simplified: truncate does not zap MAP_PRIVATE copies (its second, `even_cows`,
//! `unmap_mapping_range`), no fault-around (`do_fault_around` maps only the faulting page),
//! `anon_vma` and the anonymous rmap, dirty tracking and writeback of page-cache
//! pages are not modelled; `munmap` unlinks file VMAs in its PTE step without
//! `i_mmap_rwsem` (a walker that read `i_mmap` earlier finds the VMA's PTEs cleared, as if it
//! had waited).

use crate::machine::Machine;
use crate::page_alloc::FrameRun;
use crate::state::{MmId, RwSem, TaskId};
use shootdown_hw::pagetable::{Pte, Vpn};
use std::collections::BTreeMap;

/// Index of a [`File`] in `Machine::files`.
pub type FileId = u32;

/// A MAP_SHARED mapping of a file: pages `[start, start + npages)` map the file's pages from
/// page offset `pgoff`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Vma {
    pub start: Vpn,
    pub npages: u64,
    pub file: FileId,
    pub pgoff: u64,
    /// MAP_PRIVATE: a write fault copies the file's page into a new anonymous one
    /// (`do_cow_fault`, or `wp_page_copy` of a page mapped read-only), which a zap frees; a read
    /// fault maps the page-cache page read-only.
    pub private: bool,
}

impl Vma {
    pub fn end(&self) -> Vpn {
        self.start + self.npages
    }

    pub fn contains(&self, vpn: Vpn) -> bool {
        self.start <= vpn && vpn < self.end()
    }

    /// The file page `vpn` maps (`linear_page_index`).
    pub fn pgoff_of(&self, vpn: Vpn) -> u64 {
        self.pgoff + (vpn - self.start)
    }

    /// The pages of the VMA that map file pages at or after page offset `from` (what
    /// `unmap_mapping_range(mapping, from, 0)` zaps in it), if any.
    pub fn range_from(&self, from: u64) -> Option<(Vpn, Vpn)> {
        let first = self.start + from.saturating_sub(self.pgoff);
        (first < self.end()).then_some((first, self.end()))
    }
}

/// An inode and its `struct address_space` (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct File {
    pub name: String,
    /// `i_size` in pages (a device file: pages its fault handler serves).
    pub size: u64,
    /// `mapping->i_pages`: the page cache, page offset -> frame. Changed only through
    /// [`File::cache_insert`] and [`File::cache_remove`], which keep `page_frames`.
    pub pages: BTreeMap<u64, u32>,
    /// The frames of `pages` (a function of it: the reverse index a free looks a frame up in).
    pub page_frames: std::collections::BTreeSet<u32>,
    /// A device file: the first frame of its memory (VM_PFNMAP mappings of it map
    /// `device_pfn + pgoff`) and how many frames it has.
    pub device_pfn: Option<u32>,
    pub device_pages: u64,
    /// `mapping->i_mmap`: the VMAs mapping the file as `(mm, vma start)`, in traversal order.
    pub i_mmap: Vec<(MmId, Vpn)>,
    /// `mapping->i_mmap_rwsem`.
    pub i_mmap_rwsem: RwSem,
}

impl File {
    /// Add frame `pfn` to the page cache at page `pgoff`.
    pub(crate) fn cache_insert(&mut self, pgoff: u64, pfn: u32) {
        if let Some(old) = self.pages.insert(pgoff, pfn) {
            self.page_frames.remove(&old);
        }
        self.page_frames.insert(pfn);
    }

    /// Remove page `pgoff` from the page cache.
    pub(crate) fn cache_remove(&mut self, pgoff: u64) {
        if let Some(pfn) = self.pages.remove(&pgoff) {
            self.page_frames.remove(&pfn);
        }
    }

    /// The frame a mapping of page `pgoff` maps, if the file has one there now.
    fn frame(&self, pgoff: u64) -> Option<u32> {
        match self.device_pfn {
            Some(base) => (pgoff < self.size).then(|| base + pgoff as u32),
            None => self.pages.get(&pgoff).copied(),
        }
    }
}

impl Machine {
    /// A file of `npages` pages: a regular file (page cache filled on first use) or, with
    /// `device`, a device whose memory its mmap maps VM_PFNMAP. Returns its id.
    pub fn add_file(&mut self, name: &str, npages: u64, device: bool) -> FileId {
        let device_pfn = device.then(|| self.alloc_frames(npages));
        self.files.push(File {
            name: name.to_string(),
            size: npages,
            pages: BTreeMap::new(),
            page_frames: Default::default(),
            device_pfn,
            device_pages: if device { npages } else { 0 },
            i_mmap: Vec::new(),
            i_mmap_rwsem: RwSem::default(),
        });
        (self.files.len() - 1) as FileId
    }

    /// `mmap(start, npages, PROT_READ | PROT_WRITE, MAP_SHARED, file, pgoff)` in `mm` (set-up),
    /// pre-faulted with `populate` (MAP_POPULATE: every page of the file the VMA covers mapped
    /// writable, page-cache pages read in).
    pub fn map_file(
        &mut self,
        mm: MmId,
        start: Vpn,
        npages: u64,
        file: FileId,
        pgoff: u64,
        populate: bool,
    ) {
        let vma = Vma {
            start,
            npages,
            file,
            pgoff,
            private: false,
        };
        self.vma_link(mm, vma);
        if !populate {
            return;
        }
        for vpn in start..vma.end() {
            let Some(pfn) = self.filemap_fault(vma, vpn) else {
                continue;
            };
            self.ensure_table(mm, vpn);
            let space = &mut self.mms[mm as usize].space;
            let pte = Pte {
                present: true,
                writable: true,
                pfn,
                ..space.pte(vpn)
            };
            space.ptes.insert(vpn, pte);
        }
    }

    /// The file VMA of `mm` covering `vpn`, if any.
    pub(crate) fn vma_at(&self, mm: MmId, vpn: Vpn) -> Option<Vma> {
        self.mms[mm as usize]
            .vmas
            .iter()
            .find(|v| v.contains(vpn))
            .copied()
    }

    /// `vma_link()`: add `vma` to `mm` (by address) and to its file's `i_mmap` (after the VMAs
    /// with a `vm_pgoff` not above its own).
    pub(crate) fn vma_link(&mut self, mm: MmId, vma: Vma) {
        let vmas = &mut self.mms[mm as usize].vmas;
        let at = vmas.partition_point(|v| v.start < vma.start);
        vmas.insert(at, vma);
        let pgoff_of = |&(m, s): &(MmId, Vpn)| {
            self.mms[m as usize]
                .vmas
                .iter()
                .find(|v| v.start == s)
                .map_or(0, |v| v.pgoff)
        };
        let i_mmap = &self.files[vma.file as usize].i_mmap;
        let at = i_mmap.partition_point(|e| pgoff_of(e) <= vma.pgoff);
        self.files[vma.file as usize]
            .i_mmap
            .insert(at, (mm, vma.start));
    }

    /// `unlink_file_vma()` + removal from the mm: the VMA of `mm` starting at `start`.
    pub(crate) fn vma_unlink(&mut self, mm: MmId, start: Vpn) -> Option<Vma> {
        let vmas = &mut self.mms[mm as usize].vmas;
        let i = vmas.iter().position(|v| v.start == start)?;
        let vma = vmas.remove(i);
        self.files[vma.file as usize]
            .i_mmap
            .retain(|&e| e != (mm, start));
        Some(vma)
    }

    /// munmap's `do_vmi_align_munmap()` for file VMAs: remove those inside
    /// `[start, start + npages)`, splitting the ones it cuts (`__split_vma`: the pieces outside
    /// stay, each in `i_mmap`).
    pub(crate) fn unmap_file_vmas(&mut self, mm: MmId, start: Vpn, npages: u64) {
        let end = start + npages;
        let cut: Vec<Vma> = self.mms[mm as usize]
            .vmas
            .iter()
            .filter(|v| v.start < end && start < v.end())
            .copied()
            .collect();
        for v in cut {
            self.vma_unlink(mm, v.start);
            if v.start < start {
                self.vma_link(
                    mm,
                    Vma {
                        npages: start - v.start,
                        ..v
                    },
                );
            }
            if end < v.end() {
                self.vma_link(
                    mm,
                    Vma {
                        start: end,
                        npages: v.end() - end,
                        pgoff: v.pgoff_of(end),
                        ..v
                    },
                );
            }
        }
    }

    /// `filemap_fault()` (a device: the driver's `vm_ops->fault`): the frame page `vpn` of
    /// `vma` maps, reading it into the page cache if absent; `None` past the end of the file
    /// (`VM_FAULT_SIGBUS`).
    pub(crate) fn filemap_fault(&mut self, vma: Vma, vpn: Vpn) -> Option<u32> {
        let pgoff = vma.pgoff_of(vpn);
        let f = &self.files[vma.file as usize];
        if pgoff >= f.size {
            return None;
        }
        if let Some(pfn) = f.frame(pgoff) {
            return Some(pfn);
        }
        let pfn = self.alloc_frame();
        self.files[vma.file as usize].cache_insert(pgoff, pfn);
        Some(pfn)
    }

    /// The VMA of `mm` that starts at `start`, if it is still there.
    pub(crate) fn vma_by_start(&self, mm: MmId, start: Vpn) -> Option<Vma> {
        self.mms[mm as usize]
            .vmas
            .iter()
            .find(|v| v.start == start)
            .copied()
    }

    /// Whether a PTE in a VMA of `file` maps frame `pfn` (`folio_mapped()`).
    pub(crate) fn file_frame_mapped(&self, file: FileId, pfn: u32) -> bool {
        self.files[file as usize].i_mmap.iter().any(|&(mm, s)| {
            let Some(v) = self.vma_by_start(mm, s) else {
                return false;
            };
            self.mms[mm as usize]
                .space
                .ptes
                .range(v.start..v.end())
                .any(|(_, p)| p.present && p.pfn == pfn)
        })
    }

    /// The frames of `frames` whose last reference an unmap's free drops: those a file still
    /// holds (its page cache, its device memory) or a PTE of one of its VMAs still maps lose
    /// only that mapping's reference and stay allocated.
    pub(crate) fn drop_file_refs(&self, frames: Vec<FrameRun>) -> Vec<FrameRun> {
        if self.files.is_empty() {
            return frames;
        }
        let held = |pfn: u32| {
            self.files.iter().enumerate().any(|(i, f)| {
                f.device_pfn
                    .is_some_and(|b| b <= pfn && pfn < b + f.device_pages as u32)
                    || f.page_frames.contains(&pfn)
                    || self.file_frame_mapped(i as FileId, pfn)
            })
        };
        let mut out = Vec::new();
        for (first, n) in frames {
            for pfn in first..first + n {
                if !held(pfn) {
                    crate::page_alloc::push_run(&mut out, pfn, 1);
                }
            }
        }
        out
    }

    /// The tasks waiting for `file`'s `i_mmap_rwsem`, renamed (symmetry reduction).
    pub(crate) fn rename_i_mmap_waiters(&mut self, pt: &dyn Fn(TaskId) -> TaskId) {
        for f in self.files.iter_mut() {
            for w in f.i_mmap_rwsem.waiters.iter_mut() {
                w.0 = pt(w.0);
            }
        }
    }
}
