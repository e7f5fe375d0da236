//! What every command file uses: the parsed arguments' types, the shared
//! helpers and the commands themselves.

pub(crate) use crate::cli::*;
pub(crate) use crate::commands::{
    agent::*, apply::*, auth::*, autoscaler::*, check::*, controller::*, describe::*, docs::*, eval::*, explain::*, get::*, node::*, plan::*, rollout::*,
    secret::*, status::*, test::*,
};
pub(crate) use crate::common::*;
pub(crate) use crate::etcd_args::EtcdArgs;
pub(crate) use crate::rules_io::*;
pub(crate) use std::path::PathBuf;
pub(crate) use std::process::ExitCode;
