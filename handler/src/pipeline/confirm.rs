//! Confirm out of band: one batched question to the cloud for every
//! instance of the invocation. Any error makes every answer a failed lookup,
//! which the core never takes for "off".

use std::collections::HashMap;
use std::time::Instant;

use tracing::warn;

use super::Ctx;
use crate::core::facts::Confirmation;
use crate::core::instance::InstanceId;
use crate::core::metrics::{Dependency, Stage};

/// The cloud's answer for each of `ids`; an id it does not know is
/// [`Confirmation::NotFound`].
pub(super) async fn instances(
    ctx: &Ctx<'_>,
    ids: &[InstanceId],
) -> HashMap<InstanceId, Confirmation> {
    if ids.is_empty() {
        return HashMap::new();
    }
    let started = Instant::now();
    let described = ctx.cloud.describe_instances(ids).await;
    ctx.meter.stage(Stage::Confirm, started.elapsed());
    match described {
        Ok(found) => {
            let mut map: HashMap<InstanceId, Confirmation> = ids
                .iter()
                .map(|id| (id.clone(), Confirmation::NotFound))
                .collect();
            for facts in found {
                if map.contains_key(&facts.id) {
                    map.insert(facts.id.clone(), Confirmation::Seen(facts));
                }
            }
            map
        }
        Err(e) => {
            ctx.meter.error(Dependency::Ec2);
            warn!(error = %e, "could not confirm instance states; nothing will be fenced");
            ids.iter()
                .map(|id| {
                    (
                        id.clone(),
                        Confirmation::LookupFailed {
                            error: e.to_string(),
                        },
                    )
                })
                .collect()
        }
    }
}
