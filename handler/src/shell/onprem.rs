//! The on-premises machines of `REDFISH_INVENTORY`: the inventory read from
//! its file, and the clients of its BMCs. Read once at start: a file that
//! cannot be read or does not parse stops the start with its reason, so
//! that no node is judged by a half-read inventory.

use std::sync::Arc;

use crate::core::settings::redfish::{Inventory, RedfishFiles};

/// The inventory and, in the build that has them, its BMCs' clients.
pub struct OnPrem {
    /// Which machine backs which Node.
    pub inventory: Arc<Inventory>,
    /// The BMCs.
    #[cfg(feature = "redfish")]
    pub bmcs: crate::shell::cloud::redfish::Redfish,
}

impl OnPrem {
    /// Reads the inventory and builds its clients.
    pub fn load(files: &RedfishFiles) -> Result<Self, String> {
        let at = |why: String| format!("REDFISH_INVENTORY={}: {why}", files.inventory);
        let text = std::fs::read_to_string(&files.inventory).map_err(|e| at(e.to_string()))?;
        let inventory = Arc::new(Inventory::parse(&text).map_err(at)?);
        #[cfg(feature = "redfish")]
        {
            let bmcs = crate::shell::cloud::redfish::Redfish::new(
                inventory.clone(),
                files.credentials_dir.clone().into(),
            )
            .map_err(at)?;
            Ok(Self { inventory, bmcs })
        }
        #[cfg(not(feature = "redfish"))]
        {
            let _ = inventory;
            Err(at(
                "on-premises machines need a build with the `redfish` feature (the on-premises image), which has the Redfish client".into(),
            ))
        }
    }
}
