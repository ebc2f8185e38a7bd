//! The functional core: every decision node-fencer makes, as pure functions
//! over plain facts. Nothing here does I/O; the shell gathers the facts and
//! the pipeline carries the results out. Its folders say what each part is:
//! what comes in, what the core knows, how it decides, what goes out, and
//! the settings.

pub mod inbound;
pub mod model;
pub mod outbound;
pub mod rules;
pub mod settings;
