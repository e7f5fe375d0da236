//! ccattler auth: etcd users and roles.

#[allow(unused_imports)]
use crate::prelude::*;

/// The credentials file an `auth` command writes to.
pub(crate) fn credentials_file(etcd: &EtcdArgs) -> anyhow::Result<&std::path::Path> {
    etcd.credentials.as_deref().ok_or_else(|| anyhow::anyhow!("auth commands need --credentials FILE (the 0600 file passwords go to)"))
}

pub(crate) fn auth(action: AuthAction) -> anyhow::Result<ExitCode> {
    use ccattler_store::auth;
    let rt = runtime()?;
    match action {
        AuthAction::Bootstrap { etcd, secret_key } => {
            let file = credentials_file(&etcd)?;
            // Bootstrap talks to an etcd without auth: no user.
            let cfg = no_user(&etcd)?;
            if let Some(path) = &secret_key {
                if !path.exists() {
                    ccattler_store::seal::ClusterKeys::create(path)?;
                    eprintln!("created the cluster secret key {} (mode 0600)", path.display());
                }
            }
            let users = rt.block_on(async {
                let mut client = ccattler_store::etcd::connect(&cfg).await?;
                anyhow::Ok(auth::bootstrap(&mut client, file).await?)
            })?;
            eprintln!("created users {} (passwords in {}); auth is enabled", users.join(", "), file.display());
        }
        AuthAction::AddNode { node, address_range, etcd } => {
            let file = credentials_file(&etcd)?.to_path_buf();
            let cfg = etcd.config_as(Some(auth::ROOT))?;
            let user = rt.block_on(async {
                let mut client = ccattler_store::etcd::connect(&cfg).await?;
                let user = auth::add_node(&mut client, &node, &file).await?;
                if let Some(range) = &address_range {
                    client.put(format!("desired/node/{node}/address_range"), range.as_str(), None).await?;
                }
                anyhow::Ok(user)
            })?;
            eprintln!("created user {user}, confined to node {node}'s prefixes (password in {})", file.display());
            if let Some(range) = address_range {
                eprintln!("node {node}'s instances may be reached only inside {range}");
            }
        }
        AuthAction::RemoveNode { node, etcd } => {
            let cfg = etcd.config_as(Some(auth::ROOT))?;
            let user = rt.block_on(async {
                let mut client = ccattler_store::etcd::connect(&cfg).await?;
                anyhow::Ok(auth::remove_node(&mut client, &node).await?)
            })?;
            eprintln!("deleted user and role {user}");
        }
        AuthAction::Rotate { user, etcd } => {
            let file = credentials_file(&etcd)?.to_path_buf();
            let cfg = etcd.config_as(Some(auth::ROOT))?;
            rt.block_on(async {
                let mut client = ccattler_store::etcd::connect(&cfg).await?;
                anyhow::Ok(auth::rotate(&mut client, &user, &file).await?)
            })?;
            eprintln!("new password for {user} appended to {}", file.display());
        }
        AuthAction::Regrant { etcd } => {
            let cfg = etcd.config_as(Some(auth::ROOT))?;
            let roles = rt.block_on(async {
                let mut client = ccattler_store::etcd::connect(&cfg).await?;
                anyhow::Ok(auth::regrant(&mut client).await?)
            })?;
            eprintln!("granted roles {} what this version gives them", roles.join(", "));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The connection without any user (TLS and endpoints only).
pub(crate) fn no_user(etcd: &EtcdArgs) -> anyhow::Result<ccattler_store::EtcdConfig> {
    let mut plain = etcd.clone();
    plain.credentials = None;
    plain.as_user = None;
    plain.etcd_user = None;
    plain.etcd_password = None;
    plain.config()
}
