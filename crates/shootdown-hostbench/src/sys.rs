//! Thin, checked wrappers over the few raw system calls the cases share: errno naming, pipes,
//! and one-byte pipe I/O.

use crate::HostError;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The calling thread's `errno` after a failed call.
pub(crate) fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// "EPERM", "EINVAL", … for the errnos these calls can return; "errno N (text)" otherwise.
pub(crate) fn errno_name(errno: i32) -> String {
    let name = match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EEXIST => "EEXIST",
        libc::EINVAL => "EINVAL",
        libc::ENFILE => "ENFILE",
        libc::EMFILE => "EMFILE",
        libc::EPIPE => "EPIPE",
        libc::ENOSYS => "ENOSYS",
        _ => {
            return format!(
                "errno {errno} ({})",
                std::io::Error::from_raw_os_error(errno)
            )
        }
    };
    name.to_string()
}

/// A [`HostError::Syscall`] for `call` from the current `errno`.
pub(crate) fn syscall_error(call: &str, hint: &str) -> HostError {
    HostError::Syscall {
        call: call.to_string(),
        errno: errno_name(last_errno()),
        hint: hint.to_string(),
    }
}

/// A close-on-exec pipe: (read end, write end).
pub(crate) fn pipe() -> Result<(OwnedFd, OwnedFd), HostError> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid two-int buffer for pipe2 to fill.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    if rc != 0 {
        return Err(syscall_error(
            "pipe2",
            "out of file descriptors? raise `ulimit -n`",
        ));
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((r, w))
}

/// Write one byte, retrying on EINTR.
pub(crate) fn write_byte(fd: &OwnedFd) -> Result<(), HostError> {
    let byte = 1u8;
    loop {
        // SAFETY: writes one byte from a live local to an open descriptor.
        let n = unsafe { libc::write(fd.as_raw_fd(), (&byte as *const u8).cast(), 1) };
        if n == 1 {
            return Ok(());
        }
        if n < 0 && last_errno() == libc::EINTR {
            continue;
        }
        return Err(syscall_error("write to a ping-pong pipe", "partner gone"));
    }
}

/// Read one byte, retrying on EINTR. `Ok(false)` at end of file (the writer closed).
pub(crate) fn read_byte(fd: &OwnedFd) -> Result<bool, HostError> {
    let mut byte = 0u8;
    loop {
        // SAFETY: reads at most one byte into a live local from an open descriptor.
        let n = unsafe { libc::read(fd.as_raw_fd(), (&mut byte as *mut u8).cast(), 1) };
        match n {
            1 => return Ok(true),
            0 => return Ok(false),
            _ if last_errno() == libc::EINTR => continue,
            _ => return Err(syscall_error("read from a ping-pong pipe", "partner gone")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_names() {
        assert_eq!(errno_name(libc::EPERM), "EPERM");
        assert_eq!(errno_name(libc::EEXIST), "EEXIST");
        assert!(errno_name(libc::ENOTTY).starts_with("errno "));
    }

    #[test]
    fn pipe_round_trip() {
        let (r, w) = pipe().expect("pipe");
        write_byte(&w).expect("write");
        assert!(read_byte(&r).expect("read"));
        drop(w);
        assert!(!read_byte(&r).expect("eof"));
    }
}
