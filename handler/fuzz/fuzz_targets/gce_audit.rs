//! The Compute Engine audit log parsers (a Pub/Sub push body, an Eventarc
//! body) on any JSON document: a well-formed VM or an input error, never a
//! panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use node_fencer::core::inbound::trigger::gce_audit::{self, AUDIT_LOG_WRITTEN, AuditEvent};
use node_fencer::core::model::gce::GceInstance;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    for parsed in [
        gce_audit::parse_push(value.clone()),
        gce_audit::parse_eventarc(AUDIT_LOG_WRITTEN, None, value),
    ] {
        if let Ok(AuditEvent::Suspect { instance, .. }) = parsed {
            // What is let through names a VM exactly: it reads back as itself.
            assert_eq!(
                GceInstance::from_provider_id(&instance.provider_id()),
                Some(instance)
            );
        }
    }
});
