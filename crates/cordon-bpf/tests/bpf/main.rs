//! cordon-bpf's kernel tests, run as root for real (CI sets CORDON_REQUIRE_PRIVILEGED=1, which
//! turns a missing privilege or kernel feature into a failure instead of a skip).
//!
//! Every security test has a negative control: the same probe from a process in a cgroup
//! without the programs (or before they are attached) succeeds. Destinations are loopback
//! addresses only; servers are run by the test process, outside the test cgroups.

mod common;
mod egress;
mod events;
mod persist;
mod sabotage;
mod shared;
