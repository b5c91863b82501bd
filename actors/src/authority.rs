//! Who may move whose money, decided in one place: every intake endpoint and the intake's
//! writes ask here, and nowhere else decides it.
//!
//! - An account belongs to the API client that opened it (`accounts.owner`; `''` is the
//!   anonymous scope of an intake that does not authenticate). Only its owner debits it or
//!   reads its balance and postings; anyone may credit an existing customer account
//!   (paying someone).
//! - A transfer is seen by the client that created it and by the owners of both of its
//!   accounts (the payee sees money that came in).
//! - Money enters only by issuance, from the issuance account of its currency, by a client
//!   holding the `issue` scope: an opening balance or a top-up. Issuance accounts are
//!   nobody's to debit or credit through a transfer.
//! - Each client holds scopes ([`Scope`]); a request outside them is refused.
//!
//! A client that adopts the anonymous scope (`adopts_anonymous`, for the cut-over to an
//! authenticated intake) owns what anonymous requests opened as well.

use std::fmt;

/// What a client may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// `POST /accounts` (with a zero opening balance; more needs [`Scope::Issue`] too).
    AccountsOpen,
    /// `POST /transfers` (debiting its own accounts only).
    TransfersCreate,
    /// `POST /orders`.
    OrdersCreate,
    /// `GET` of its own accounts, transfers and orders.
    Read,
    /// Issue money: opening balances and top-ups (`POST /issuances`). Privileged.
    Issue,
}

impl Scope {
    /// Every scope, in the order of the configuration's documentation.
    pub const ALL: [Self; 5] = [Self::AccountsOpen, Self::TransfersCreate, Self::OrdersCreate, Self::Read, Self::Issue];

    /// The scope's name in the configuration (`http.clients[].scopes`).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::AccountsOpen => "accounts:open",
            Self::TransfersCreate => "transfers:create",
            Self::OrdersCreate => "orders:create",
            Self::Read => "read",
            Self::Issue => "issue",
        }
    }

    /// The scope named `name`.
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of scopes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Scopes(u8);

impl Scopes {
    /// Every scope but [`Scope::Issue`]: what a client has when its configuration names none.
    #[must_use]
    pub fn ordinary() -> Self {
        Scope::ALL.into_iter().filter(|s| *s != Scope::Issue).collect()
    }

    /// Every scope.
    #[must_use]
    pub fn all() -> Self {
        Scope::ALL.into_iter().collect()
    }

    #[must_use]
    pub fn contains(self, scope: Scope) -> bool {
        self.0 & scope.bit() != 0
    }

    /// The names of the scopes held, in [`Scope::ALL`]'s order.
    #[must_use]
    pub fn names(self) -> Vec<&'static str> {
        Scope::ALL.into_iter().filter(|s| self.contains(*s)).map(Scope::name).collect()
    }
}

impl FromIterator<Scope> for Scopes {
    fn from_iter<I: IntoIterator<Item = Scope>>(iter: I) -> Self {
        Self(iter.into_iter().fold(0, |bits, s| bits | s.bit()))
    }
}

/// Who asks: an API client (or the anonymous scope), what it may do, and whether it adopts
/// what anonymous requests made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The client's name; empty for the anonymous scope.
    pub name: String,
    pub scopes: Scopes,
    pub adopts_anonymous: bool,
}

/// An account as authorization needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountRef<'a> {
    pub owner: &'a str,
    /// `customer` or `issuance` (`accounts.kind`).
    pub kind: &'a str,
}

/// `accounts.kind` of an account clients hold.
pub const CUSTOMER: &str = "customer";
/// `accounts.kind` of the account money is issued from, one per currency.
pub const ISSUANCE: &str = "issuance";
/// Ids of issuance accounts start with this; no client may open one (in any letter case).
pub use tally_schema::values::ISSUANCE_PREFIX;

/// The issuance account of `currency`.
#[must_use]
pub fn issuance_account(currency: &str) -> String {
    format!("{ISSUANCE_PREFIX}{currency}")
}

impl Principal {
    /// The anonymous scope of an intake that does not authenticate, holding `scopes`.
    #[must_use]
    pub fn anonymous(scopes: Scopes) -> Self {
        Self { name: String::new(), scopes, adopts_anonymous: false }
    }

    /// Whether it holds `scope`.
    #[must_use]
    pub fn may(&self, scope: Scope) -> bool {
        self.scopes.contains(scope)
    }

    /// Whether something owned (or created) by `owner` is its own.
    #[must_use]
    pub fn owns(&self, owner: &str) -> bool {
        self.name == owner || (self.adopts_anonymous && owner.is_empty())
    }

    /// Whether it may debit `account` (`None`: no such account). The same answer for an
    /// account that does not exist and one that is someone else's: no existence oracle.
    #[must_use]
    pub fn may_debit(&self, account: Option<&AccountRef<'_>>) -> bool {
        account.is_some_and(|a| a.kind == CUSTOMER && self.owns(a.owner))
    }

    /// Whether it may credit `account` through a transfer: any customer account.
    #[must_use]
    pub fn may_credit(&self, account: &AccountRef<'_>) -> bool {
        account.kind == CUSTOMER
    }

    /// Whether it may read `account` (balance and postings): its owner a customer account;
    /// an issuer (the `issue` scope) an issuance account, whose postings are every issuance.
    #[must_use]
    pub fn may_read_account(&self, account: &AccountRef<'_>) -> bool {
        match account.kind {
            CUSTOMER => self.owns(account.owner),
            _ => self.may(Scope::Issue),
        }
    }

    /// Whether it may read a transfer created by `creator` between `source` and
    /// `destination` (`None` when no such account): its creator and the owners of its
    /// customer accounts (an issuance account's owner reads nothing through it).
    #[must_use]
    pub fn may_read_transfer(
        &self,
        creator: &str,
        source: Option<&AccountRef<'_>>,
        destination: Option<&AccountRef<'_>>,
    ) -> bool {
        let party = |a: Option<&AccountRef<'_>>| a.is_some_and(|a| a.kind == CUSTOMER && self.owns(a.owner));
        self.owns(creator) || party(source) || party(destination)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(name: &str, scopes: Scopes) -> Principal {
        Principal { name: name.into(), scopes, adopts_anonymous: false }
    }

    const A_ACCOUNT: AccountRef<'static> = AccountRef { owner: "a", kind: CUSTOMER };
    const ISSUER: AccountRef<'static> = AccountRef { owner: "", kind: ISSUANCE };

    #[test]
    fn only_the_owner_debits_and_anyone_credits_a_customer_account() {
        let (a, b) = (client("a", Scopes::ordinary()), client("b", Scopes::ordinary()));
        assert!(a.may_debit(Some(&A_ACCOUNT)));
        assert!(!b.may_debit(Some(&A_ACCOUNT)), "B debits A's account");
        assert!(!a.may_debit(None), "an account that does not exist reads as someone else's");
        assert!(b.may_credit(&A_ACCOUNT), "paying someone");
        for p in [&a, &b, &Principal::anonymous(Scopes::all())] {
            assert!(!p.may_debit(Some(&ISSUER)), "issuance accounts move only by issuance");
            assert!(!p.may_credit(&ISSUER));
        }
    }

    #[test]
    fn reads_are_the_owners_and_the_parties() {
        let (a, b, c) =
            (client("a", Scopes::ordinary()), client("b", Scopes::ordinary()), client("c", Scopes::ordinary()));
        let b_account = AccountRef { owner: "b", kind: CUSTOMER };
        assert!(a.may_read_account(&A_ACCOUNT) && !b.may_read_account(&A_ACCOUNT));
        assert!(a.may_read_transfer("a", Some(&A_ACCOUNT), Some(&b_account)), "the payer");
        assert!(b.may_read_transfer("a", Some(&A_ACCOUNT), Some(&b_account)), "the payee");
        assert!(!c.may_read_transfer("a", Some(&A_ACCOUNT), Some(&b_account)), "a third party");
        assert!(!c.may_read_transfer("a", None, None));
        // The issuance account's owner ('') is nobody: the anonymous caller and an adopting
        // client read no issuance account and no issuance through it.
        let anonymous = Principal::anonymous(Scopes::ordinary());
        assert!(!anonymous.may_read_account(&ISSUER));
        assert!(!anonymous.may_read_transfer("issuer", Some(&ISSUER), Some(&b_account)));
        assert!(b.may_read_transfer("issuer", Some(&ISSUER), Some(&b_account)), "the credited client sees its top-up");
        assert!(client("i", Scopes::all()).may_read_account(&ISSUER), "an issuer reads the issuance account");
    }

    #[test]
    fn the_anonymous_scope_is_one_owner_and_an_adopting_client_holds_it_too() {
        let anonymous = Principal::anonymous(Scopes::all());
        assert!(anonymous.may_debit(Some(&AccountRef { owner: "", kind: CUSTOMER })));
        assert!(!anonymous.may_debit(Some(&A_ACCOUNT)), "not a client's account");
        let adopting = Principal { adopts_anonymous: true, ..client("a", Scopes::ordinary()) };
        assert!(adopting.may_debit(Some(&AccountRef { owner: "", kind: CUSTOMER })));
        let anonymous_account = AccountRef { owner: "", kind: CUSTOMER };
        assert!(adopting.may_read_account(&anonymous_account) && adopting.may_read_account(&A_ACCOUNT));
        assert!(!client("b", Scopes::ordinary()).may_read_account(&anonymous_account));
    }

    #[test]
    fn scopes_parse_by_name_and_issue_is_not_ordinary() {
        for s in Scope::ALL {
            assert_eq!(Scope::parse(s.name()), Some(s));
        }
        assert_eq!(Scope::parse("admin"), None);
        assert!(!Scopes::ordinary().contains(Scope::Issue));
        assert!(Scopes::all().contains(Scope::Issue));
        let read_only: Scopes = [Scope::Read].into_iter().collect();
        assert_eq!(read_only.names(), ["read"]);
        assert!(!client("r", read_only).may(Scope::TransfersCreate));
        assert_eq!(issuance_account("BRL"), "issuance:BRL");
    }
}
