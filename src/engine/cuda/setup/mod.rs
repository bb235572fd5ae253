//! The once-per-communicator setup of the GPU engine: each rank's record and the verdict
//! computed from all of them (`record`), the protocol that gathers them and checks every
//! peer's staging (`protocol`), and its second step through host memory (`agreement`).

pub mod agreement;
pub mod protocol;
pub mod record;

pub use protocol::{run_setup, Exchange, Joined, PeerAccess, SetupError};
pub use record::{
    build_id, settings_of, Devices, Identity, LocalFailure, SetupRecord, Verdict, AGREED_SETTINGS,
};
