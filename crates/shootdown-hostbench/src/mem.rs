//! Anonymous mappings owned by RAII handles, and touching their pages.

use crate::sys::syscall_error;
use crate::HostError;

/// The page size the cases assume (x86 base pages).
pub(crate) const PAGE: usize = 4096;

/// A private anonymous mapping, unmapped on drop.
pub(crate) struct Mapping {
    addr: usize,
    len: usize,
}

impl Mapping {
    /// `len` bytes of private anonymous memory with `prot`, THP off (`MADV_NOHUGEPAGE`, which
    /// also turns off multi-size THP) so every fault maps one 4 KiB page through a PTE.
    pub(crate) fn anon(len: usize, prot: libc::c_int) -> Result<Self, HostError> {
        let map = Self::map(len, prot, 0)?;
        no_huge_pages(map.addr, len)?;
        Ok(map)
    }

    /// `len` bytes of inaccessible address space (no memory is committed).
    pub(crate) fn anon_none(len: usize) -> Result<Self, HostError> {
        Self::map(len, libc::PROT_NONE, libc::MAP_NORESERVE)
    }

    fn map(len: usize, prot: libc::c_int, flags: libc::c_int) -> Result<Self, HostError> {
        // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(syscall_error("mmap", "out of memory or address space?"));
        }
        Ok(Mapping {
            addr: p as usize,
            len,
        })
    }

    /// Take ownership of a mapping the caller just made with `mmap`.
    pub(crate) fn adopt(addr: usize, len: usize) -> Self {
        Mapping { addr, len }
    }

    /// Unmap now, reporting failure (dropping unmaps too, silently).
    pub(crate) fn unmap(self) -> Result<(), HostError> {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: unmaps exactly the range this handle owns; the handle is gone afterwards.
        if unsafe { libc::munmap(this.addr as *mut libc::c_void, this.len) } != 0 {
            return Err(syscall_error("munmap", "unexpected"));
        }
        Ok(())
    }

    pub(crate) fn addr(&self) -> usize {
        self.addr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Address of page `i`.
    pub(crate) fn page(&self, i: usize) -> usize {
        debug_assert!(i * PAGE < self.len);
        self.addr + i * PAGE
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the range this handle owns; nothing borrows it past the drop.
        unsafe {
            libc::munmap(self.addr as *mut libc::c_void, self.len);
        }
    }
}

/// `madvise(MADV_NOHUGEPAGE)` over a range of our own mapping (once, when it is made).
pub(crate) fn no_huge_pages(addr: usize, len: usize) -> Result<(), HostError> {
    // SAFETY: advice on a range this crate mapped; it changes no memory contents.
    let rc = unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_NOHUGEPAGE) };
    // EINVAL: a kernel built without THP, where the advice is moot.
    if rc != 0 && crate::sys::last_errno() != libc::EINVAL {
        return Err(syscall_error(
            "madvise(MADV_NOHUGEPAGE)",
            "cannot turn THP off",
        ));
    }
    Ok(())
}

/// Transparent huge pages off for this process while it lives (`prctl(PR_SET_THP_DISABLE)`:
/// the mm's `MMF_DISABLE_THP`), restored on drop. Set once per case rather than with an
/// `madvise(MADV_NOHUGEPAGE)` per mapping, so a timed iteration holds no system call the
/// model's twin of it lacks.
pub(crate) struct ThpDisabled {
    was: bool,
}

impl ThpDisabled {
    pub(crate) fn new() -> Result<Self, HostError> {
        // SAFETY: prctl with integer arguments only.
        let was = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        if was < 0 {
            return Err(syscall_error(
                "prctl(PR_GET_THP_DISABLE)",
                "cannot read the THP switch",
            ));
        }
        // SAFETY: as above.
        if unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) } != 0 {
            return Err(syscall_error(
                "prctl(PR_SET_THP_DISABLE)",
                "cannot turn THP off",
            ));
        }
        Ok(ThpDisabled { was: was != 0 })
    }
}

impl Drop for ThpDisabled {
    fn drop(&mut self) {
        if !self.was {
            // SAFETY: as above; restores the process's own setting.
            unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 0, 0, 0, 0) };
        }
    }
}

/// Write one byte to each of `pages` consecutive pages from `addr` (a fault each if unmapped).
///
/// # Safety
/// The pages must be mapped writable and owned by the caller.
#[inline]
pub(crate) unsafe fn touch_pages(addr: usize, pages: usize) {
    for i in 0..pages {
        std::ptr::write_volatile((addr + i * PAGE) as *mut u8, 1);
    }
}
