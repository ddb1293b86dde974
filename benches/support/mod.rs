//! Parts of the gateway benchmark: the processes it starts, the load it
//! makes and the figures it keeps.

pub mod cpu;
pub mod direct;
pub mod gateway;
pub mod http;
pub mod procs;
pub mod rate;
pub mod stats;
pub mod watchers;
pub mod wrk;
