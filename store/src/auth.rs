//! The security boundary, held by etcd itself (DESIGN §6): one etcd user and
//! role per writer, each confined to its prefixes, created by `ccattler auth
//! bootstrap` (root, controller, user, autoscaler; then auth is enabled) and
//! `ccattler auth add-node N` (user and role `agent-N`). The code's own checks
//! (the agent's `ObservedKey`, `apply`'s prefixes) are a second line.
//!
//! [`grants`] is the role table as data; the RBAC matrix test checks what
//! etcd enforces against DESIGN's table, written out on its own.

use crate::credentials::{self, CredentialsError, Password};
use crate::etcd::EtcdError;
use etcd_client::{Client, Permission};
use std::path::Path;

pub const ROOT: &str = "root";
pub const CONTROLLER: &str = "controller";
pub const USER: &str = "user";
pub const AUTOSCALER: &str = "autoscaler";

/// The etcd user (and role) of node N's agent.
pub fn agent_user(node: &str) -> String {
    format!("agent-{node}")
}

/// What a role may do with a range of keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    Read,
    Write,
    ReadWrite,
}

impl Access {
    fn union(self, other: Access) -> Access {
        if self == other {
            self
        } else {
            Access::ReadWrite
        }
    }
}

/// A range of keys a permission covers.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Range {
    /// Every key.
    All,
    /// Every key starting with this prefix.
    Prefix(String),
    /// This one key.
    Key(String),
}

/// The namespaces every role but the controller's may be granted to read;
/// `secret/` is not among them.
pub const PUBLIC_NAMESPACES: [&str; 7] = ["desired/", "intent/", "observed/", "effective/", "placement/", "endpoint/", "status/"];

/// The namespaces only the controller may write (no other role is granted
/// them): a range inside one changes only by the controller's own hand.
pub const CONTROLLER_WRITES: [&str; 5] = ["effective/", "placement/", "endpoint/", "status/", "secret/node/"];

/// The permissions of a role, one per range (etcd keeps one permission per
/// range: granting read and then write on one prefix would leave only write).
pub fn grants(role: &str) -> Option<Vec<(Range, Access)>> {
    use Access::*;
    let p = |s: &str| Range::Prefix(s.to_string());
    let list: Vec<(Range, Access)> = match role {
        CONTROLLER => {
            let mut g = vec![(Range::All, Read)];
            g.extend(CONTROLLER_WRITES.map(|s| (p(s), Write)));
            g
        }
        USER => {
            let mut g: Vec<(Range, Access)> = PUBLIC_NAMESPACES.iter().map(|s| (p(s), Read)).collect();
            g.extend(["desired/", "intent/user/", "secret/value/"].map(|s| (p(s), Write)));
            g
        }
        AUTOSCALER => vec![(p("effective/"), Read), (p("observed/"), Read), (p("intent/autoscaler/"), ReadWrite)],
        _ => {
            let node = role.strip_prefix("agent-").filter(|n| ccattler_parser::pattern::is_valid_name(n))?;
            let mut g: Vec<(Range, Access)> = ["placement/node/", "effective/node/", "secret/node/"].map(|s| (p(&format!("{s}{node}/")), Read)).to_vec();
            g.push((p(&format!("observed/node/{node}/")), ReadWrite));
            // The cluster clock, which the agent's heartbeat carries (rules/nodes.rules).
            g.push((Range::Key(crate::layout::CLOCK.to_string()), Read));
            g
        }
    };
    // One entry per range, the union of what it grants.
    let mut merged: std::collections::BTreeMap<Range, Access> = std::collections::BTreeMap::new();
    for (r, a) in list {
        merged.entry(r).and_modify(|x| *x = x.union(a)).or_insert(a);
    }
    Some(merged.into_iter().collect())
}

fn permission(range: &Range, access: Access) -> Permission {
    let key = match range {
        Range::All => Vec::new(),
        Range::Prefix(p) | Range::Key(p) => p.clone().into_bytes(),
    };
    let perm = match access {
        Access::Read => Permission::read(key),
        Access::Write => Permission::write(key),
        Access::ReadWrite => Permission::read_write(key),
    };
    match range {
        Range::All => perm.with_all_keys(),
        Range::Prefix(_) => perm.with_prefix(),
        Range::Key(_) => perm,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("auth is already enabled on this etcd: `auth bootstrap` runs once, against an etcd without auth (to add a node: `auth add-node`)")]
    AlreadyEnabled,
    #[error("this etcd already has users ({0}): `auth bootstrap` runs once; to start over, disable auth and delete them with etcdctl")]
    UsersExist(String),
    #[error("{0:?} is not a node name ([a-z0-9]([a-z0-9._-]*[a-z0-9])?, at most 63 characters)")]
    BadNode(String),
    #[error("user {0} already exists (to give it a new password: `ccattler auth rotate {0}`)")]
    Exists(String),
    #[error("user {0} does not exist")]
    NoSuchUser(String),
    #[error("etcd refused: {0} (auth commands other than bootstrap run as root: --credentials FILE --as root)")]
    Refused(EtcdError),
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
    #[error(transparent)]
    Etcd(#[from] EtcdError),
}

/// Whether an error is etcd refusing for lack of rights (or of a user).
pub fn is_permission_denied(e: &EtcdError) -> bool {
    use tonic::Code;
    matches!(e, EtcdError::GRpcStatus(s) if matches!(s.code(), Code::PermissionDenied | Code::Unauthenticated | Code::InvalidArgument | Code::FailedPrecondition) && is_auth_message(s.message()))
}

fn is_auth_message(m: &str) -> bool {
    ["permission denied", "user name is empty", "invalid auth token", "authentication failed", "user name not found", "auth: "].iter().any(|t| m.contains(t))
}

/// Creates a role with its grants.
async fn create_role(client: &mut Client, role: &str) -> Result<(), EtcdError> {
    client.role_add(role).await?;
    for (range, access) in grants(role).expect("a known role") {
        client.role_grant_permission(role, permission(&range, access)).await?;
    }
    Ok(())
}

async fn create_user(client: &mut Client, user: &str, password: &Password, role: &str) -> Result<(), EtcdError> {
    client.user_add(user, password.as_str(), None).await?;
    client.user_grant_role(user, role).await?;
    Ok(())
}

/// `auth bootstrap`: against an etcd without auth, creates root and the
/// controller, user and autoscaler users and roles, appends their
/// credentials to `file` (before anything is created, so none is lost), and
/// enables auth. Returns the users created.
pub async fn bootstrap(client: &mut Client, file: &Path) -> Result<Vec<String>, AuthError> {
    let existing = match client.user_list().await {
        Ok(r) => r.users().to_vec(),
        Err(e) if is_permission_denied(&e) => return Err(AuthError::AlreadyEnabled),
        Err(e) => return Err(e.into()),
    };
    if !existing.is_empty() {
        return Err(AuthError::UsersExist(existing.join(", ")));
    }
    let users = [ROOT, CONTROLLER, USER, AUTOSCALER];
    let passwords: Vec<Password> = users.iter().map(|_| credentials::generate_password()).collect();
    let entries: Vec<(&str, &Password)> = users.iter().copied().zip(passwords.iter()).collect();
    credentials::append(file, &entries)?;
    for (user, password) in &entries {
        if *user != ROOT {
            create_role(client, user).await?;
        }
        create_user(client, user, password, user).await?;
    }
    client.auth_enable().await?;
    Ok(users.map(String::from).to_vec())
}

/// `auth add-node N` (as root): user and role `agent-N`, confined to node
/// N's prefixes; the credentials are appended to `file` first.
pub async fn add_node(client: &mut Client, node: &str, file: &Path) -> Result<String, AuthError> {
    if !ccattler_parser::pattern::is_valid_name(node) {
        return Err(AuthError::BadNode(node.into()));
    }
    let user = agent_user(node);
    if user_exists(client, &user).await? {
        return Err(AuthError::Exists(user));
    }
    let password = credentials::generate_password();
    credentials::append(file, &[(&user, &password)])?;
    // A role left by a half-finished earlier try is made again.
    if role_exists(client, &user).await? {
        client.role_delete(user.as_str()).await.map_err(AuthError::Refused)?;
    }
    create_role(client, &user).await.map_err(AuthError::Refused)?;
    create_user(client, &user, &password, &user).await.map_err(AuthError::Refused)?;
    Ok(user)
}

/// `auth remove-node N` (as root): deletes user and role `agent-N`; its
/// tokens stop working at once. The node's facts stay (it becomes
/// unreachable when its heartbeat stops).
pub async fn remove_node(client: &mut Client, node: &str) -> Result<String, AuthError> {
    if !ccattler_parser::pattern::is_valid_name(node) {
        return Err(AuthError::BadNode(node.into()));
    }
    let user = agent_user(node);
    if !user_exists(client, &user).await? {
        return Err(AuthError::NoSuchUser(user));
    }
    client.user_delete(user.as_str()).await.map_err(AuthError::Refused)?;
    if role_exists(client, &user).await? {
        client.role_delete(user.as_str()).await.map_err(AuthError::Refused)?;
    }
    Ok(user)
}

/// `auth regrant` (as root): grants every existing CCattler role what this
/// version's role table gives it (an upgrade that widened a role, e.g. the
/// agents' read of the cluster clock). Idempotent; revokes nothing. Returns
/// the roles granted to.
pub async fn regrant(client: &mut Client) -> Result<Vec<String>, AuthError> {
    let roles = client.role_list().await.map_err(AuthError::Refused)?;
    let mut done = Vec::new();
    for role in roles.roles() {
        let Some(list) = grants(role) else { continue };
        for (range, access) in list {
            client.role_grant_permission(role.as_str(), permission(&range, access)).await.map_err(AuthError::Refused)?;
        }
        done.push(role.clone());
    }
    Ok(done)
}

/// `auth rotate USER` (as root): a new password, appended to `file` first.
pub async fn rotate(client: &mut Client, user: &str, file: &Path) -> Result<(), AuthError> {
    if !user_exists(client, user).await? {
        return Err(AuthError::NoSuchUser(user.into()));
    }
    let password = credentials::generate_password();
    credentials::append(file, &[(user, &password)])?;
    client.user_change_password(user, password.as_str()).await.map_err(AuthError::Refused)?;
    Ok(())
}

async fn user_exists(client: &mut Client, user: &str) -> Result<bool, AuthError> {
    let users = client.user_list().await.map_err(AuthError::Refused)?;
    Ok(users.users().iter().any(|u| u == user))
}

async fn role_exists(client: &mut Client, role: &str) -> Result<bool, AuthError> {
    let roles = client.role_list().await.map_err(AuthError::Refused)?;
    Ok(roles.roles().iter().any(|r| r == role))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_and_write_on_one_range_merge_into_one_grant() {
        let user = grants(USER).unwrap();
        assert!(user.contains(&(Range::Prefix("desired/".into()), Access::ReadWrite)));
        assert!(user.contains(&(Range::Prefix("intent/".into()), Access::Read)));
        assert!(user.contains(&(Range::Prefix("intent/user/".into()), Access::Write)));
        assert!(!user.iter().any(|(r, _)| matches!(r, Range::Prefix(p) if p.starts_with("secret/") && p != "secret/value/")));
        let ranges: Vec<&Range> = user.iter().map(|(r, _)| r).collect();
        let mut unique = ranges.clone();
        unique.dedup();
        assert_eq!(ranges, unique);
    }

    #[test]
    fn an_agent_role_is_confined_to_its_node() {
        let g = grants("agent-n1").unwrap();
        // Its node's prefixes, and the clock (one key, read only).
        assert!(g.iter().all(|(r, a)| match r {
            Range::Prefix(p) => p.ends_with("/n1/"),
            Range::Key(k) => k == crate::layout::CLOCK && *a == Access::Read,
            Range::All => false,
        }));
        assert_eq!(g.iter().filter(|(_, a)| *a != Access::Read).count(), 1);
        assert!(grants("agent-../x").is_none() && grants("agent-").is_none() && grants("nobody").is_none());
    }
}
