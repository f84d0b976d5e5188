//! The Endpoint behaviour suite over `tcp://`: both endpoints in this process, then each test
//! again with its servers, and once more with its clients, in an agent process.
mod conformance;

agent_entry!();
transport_suite!("tcp");
