//! The direct parser on any JSON document: a batch of well-formed suspects or
//! an input error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    node_fencer_fuzz::parse_json_with(
        data,
        node_fencer::core::inbound::trigger::direct::parse_batch,
    );
});
