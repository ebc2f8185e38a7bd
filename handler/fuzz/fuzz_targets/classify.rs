//! The dispatcher: any bytes give a trigger or an input error, never a panic,
//! and every suspect it names is well-formed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use node_fencer::core::inbound::trigger::{self, Trigger};
use node_fencer_fuzz::assert_well_formed;

fuzz_target!(|data: &[u8]| {
    if let Ok(Trigger::Batch(batch)) = trigger::classify_bytes(data) {
        assert_well_formed(&batch);
    }
});
