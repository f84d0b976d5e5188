//! The Endpoint behaviour suite over `softib://`: both endpoints in this process, then each
//! test again with its servers, and once more with its clients, in an agent process (the two
//! ends talk through the software provider across processes: `process_vm_*`, shared rings).
mod conformance;

agent_entry!();
transport_suite!("softib");
