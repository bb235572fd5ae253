//! Passing one file descriptor from a rank's process to its peers' on the same host: the
//! multicast object's creator serves its fd on an abstract Unix socket named after the team,
//! and every peer connects and receives it (`SCM_RIGHTS`), as NCCL and PyTorch's symmetric
//! memory pass theirs. Both ends check that the other is a process of the same user. An
//! abstract name lives as long as its socket, so nothing is left in the file system, even
//! after a crash. Every wait ends at a deadline.

use std::io::{self, ErrorKind};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

/// The one byte every message carries (a message needs data for its control part to travel).
const TAG: u8 = b'S';

/// The creator's side: a listening socket, closed on drop.
pub struct FdServer {
    listener: UnixListener,
}

impl FdServer {
    /// Listens on the abstract name `name` (unique per team: a second server of the same name
    /// on this host fails with `AddrInUse`).
    pub fn bind(name: &str) -> io::Result<FdServer> {
        let address = SocketAddr::from_abstract_name(name.as_bytes())?;
        let listener = UnixListener::bind_addr(&address)?;
        listener.set_nonblocking(true)?;
        Ok(FdServer { listener })
    }

    /// Sends `fd` to `peers` connections, each from a process of this user, before `deadline`.
    /// A connection from another user is dropped and not counted.
    pub fn serve(&self, fd: BorrowedFd<'_>, peers: usize, deadline: Instant) -> io::Result<()> {
        let mut served = 0;
        while served < peers {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if peer_is_this_user(&stream)? {
                        stream.set_nonblocking(false)?;
                        stream.set_write_timeout(Some(remaining(deadline)?))?;
                        send_fd(&stream, fd)?;
                        served += 1;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    wait_readable(self.listener.as_fd(), deadline)?;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Connects to the server named `name` (retrying until it listens) and receives its fd.
pub fn receive(name: &str, deadline: Instant) -> io::Result<OwnedFd> {
    let address = SocketAddr::from_abstract_name(name.as_bytes())?;
    let stream = loop {
        match UnixStream::connect_addr(&address) {
            Ok(stream) => break stream,
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionRefused | ErrorKind::NotFound) => {
                remaining(deadline)?;
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(e),
        }
    };
    if !peer_is_this_user(&stream)? {
        return Err(io::Error::new(
            ErrorKind::PermissionDenied,
            format!("the socket '{name}' belongs to another user"),
        ));
    }
    stream.set_read_timeout(Some(remaining(deadline)?))?;
    receive_fd(&stream)
}

/// The time left before `deadline`, or `TimedOut`.
fn remaining(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(
            ErrorKind::TimedOut,
            "the deadline passed while passing the multicast object's fd",
        ));
    }
    Ok(left)
}

/// Waits until `fd` is readable (a connection to accept) or `deadline` passes.
fn wait_readable(fd: BorrowedFd<'_>, deadline: Instant) -> io::Result<()> {
    let left = remaining(deadline)?;
    let mut poll = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let millis = left.as_millis().clamp(1, i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd for the duration of the call.
    let r = unsafe { libc::poll(&mut poll, 1, millis) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// Whether the process at the other end of `stream` runs as this process's user.
fn peer_is_this_user(stream: &UnixStream) -> io::Result<bool> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: getuid cannot fail.
    Ok(cred.uid == unsafe { libc::getuid() })
}

/// Room for one fd's control message, in bytes.
fn control_space() -> usize {
    // SAFETY: CMSG_SPACE is arithmetic on its argument.
    unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) as usize }
}

/// A buffer for one fd's control message, aligned for a `cmsghdr` (whose fields are at most
/// 8-byte words).
fn control_buffer() -> Vec<u64> {
    vec![0u64; control_space().div_ceil(8)]
}

/// Runs `f` on a message of one data byte (`data`) with room for one fd's control message
/// (`control`, from [`control_buffer`]), whose pointers stay valid for the call.
fn with_message<R>(
    data: &mut [u8; 1],
    control: &mut [u64],
    f: impl FnOnce(&mut libc::msghdr) -> R,
) -> R {
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // SAFETY: an all-zero msghdr is valid; the fields set below point at live buffers.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    message.msg_control = control.as_mut_ptr().cast();
    message.msg_controllen = control_space() as _;
    f(&mut message)
}

/// Runs a send or receive call until it is not interrupted by a signal.
fn retried(mut call: impl FnMut() -> isize) -> isize {
    loop {
        let got = call();
        if got >= 0 || io::Error::last_os_error().kind() != ErrorKind::Interrupted {
            return got;
        }
    }
}

fn send_fd(stream: &UnixStream, fd: BorrowedFd<'_>) -> io::Result<()> {
    let mut control = control_buffer();
    let sent = with_message(&mut [TAG], &mut control, |message| {
        // SAFETY: the control buffer is aligned for a cmsghdr and has room for one header and
        // one int (control_space), so CMSG_FIRSTHDR is non-null and its data holds the fd.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(message);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
            std::ptr::write_unaligned(
                libc::CMSG_DATA(header).cast::<libc::c_int>(),
                fd.as_raw_fd(),
            );
        }
        // SAFETY: `message` and the buffers it points at are live for the call.
        retried(|| unsafe { libc::sendmsg(stream.as_raw_fd(), message, libc::MSG_NOSIGNAL) })
    });
    if sent != 1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn receive_fd(stream: &UnixStream) -> io::Result<OwnedFd> {
    let mut data = [0u8];
    let mut control = control_buffer();
    let (got, fd, truncated) = with_message(&mut data, &mut control, |message| {
        // SAFETY: `message` and its buffers are live for the call; received fds are
        // close-on-exec.
        let got = retried(|| unsafe {
            libc::recvmsg(stream.as_raw_fd(), message, libc::MSG_CMSG_CLOEXEC)
        });
        if got < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: CMSG_FIRSTHDR reads the header recvmsg filled in (null when none came).
        let header = unsafe { libc::CMSG_FIRSTHDR(message) };
        // SAFETY: a non-null header lies inside `control`, aligned.
        let carries_fd = !header.is_null()
            && unsafe {
                (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS
            };
        // SAFETY: an SCM_RIGHTS header's data holds an fd the kernel installed for this
        // process, which this process now owns (and closes on every path below).
        let fd = carries_fd.then(|| unsafe {
            OwnedFd::from_raw_fd(std::ptr::read_unaligned(
                libc::CMSG_DATA(header).cast::<libc::c_int>(),
            ))
        });
        Ok((got, fd, message.msg_flags & libc::MSG_CTRUNC != 0))
    })?;
    match fd {
        Some(fd) if got == 1 && data[0] == TAG && !truncated => Ok(fd),
        // A message of another shape: its fd, if one came, is closed on drop.
        _ => Err(no_fd()),
    }
}

fn no_fd() -> io::Error {
    io::Error::new(
        ErrorKind::InvalidData,
        "the multicast object's server sent no file descriptor",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::FileExt;

    fn name(test: &str) -> String {
        format!("stragglar-test-{test}-{}", std::process::id())
    }

    /// Three receivers get a working fd of the same open file; a second server of the same
    /// name is refused while the first listens.
    #[test]
    fn every_peer_receives_the_fd_of_the_same_file() {
        let name = name("fds");
        let server = FdServer::bind(&name).unwrap();
        assert_eq!(
            FdServer::bind(&name).err().map(|e| e.kind()),
            Some(ErrorKind::AddrInUse)
        );
        let mut file = tempfile();
        file.write_all(b"multicast").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let receivers: Vec<_> = (0..3)
            .map(|_| {
                let name = name.clone();
                std::thread::spawn(move || receive(&name, deadline))
            })
            .collect();
        server.serve(file.as_fd(), 3, deadline).unwrap();
        for receiver in receivers {
            let fd = receiver.join().unwrap().unwrap();
            let mut text = [0u8; 9];
            std::fs::File::from(fd).read_exact_at(&mut text, 0).unwrap();
            assert_eq!(&text, b"multicast");
        }
    }

    /// A server whose peers never come, and a peer whose server never listens, give up at
    /// their deadlines.
    #[test]
    fn both_ends_give_up_at_the_deadline() {
        let name = name("deadline");
        let server = FdServer::bind(&name).unwrap();
        let file = tempfile();
        let start = Instant::now();
        let deadline = start + Duration::from_millis(200);
        let e = server.serve(file.as_fd(), 1, deadline).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::TimedOut);
        assert!(start.elapsed() >= Duration::from_millis(190));
        let e = receive(
            &format!("{name}-nobody"),
            Instant::now() + Duration::from_millis(100),
        )
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::TimedOut);
    }

    fn tempfile() -> std::fs::File {
        // SAFETY: memfd_create with a NUL-terminated name; the fd is new and owned here.
        unsafe {
            let fd = libc::memfd_create(c"stragglar-fd-test".as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0);
            std::fs::File::from_raw_fd(fd)
        }
    }
}
