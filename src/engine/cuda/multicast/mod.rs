//! NVLink multicast for the GPU engine: the multicast team a communicator forms (`team`), over
//! memory of the driver's virtual memory API (`super::vmm`), whose handles pass between the
//! ranks' processes as file descriptors (`fds`), counted on the host against a cap (`slots`).

pub mod fds;
pub mod local;
pub mod region;
pub mod slots;
pub mod team;
