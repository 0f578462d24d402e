//! libfabric's errors as one Rust type.
//!
//! Every entry point returns `-FI_E*` (as `int` or `ssize_t`); inside the
//! provider a failure is an [`Error`], returned in a `Result` and turned
//! into the negated code once, where the entry point returns
//! ([`Error::ret`], [`Error::ssize`], [`ret_of`], [`ssize_of`]). The codes
//! are listed once, in [`codes!`](self): the associated constants and the
//! [`ret`](crate::ret) module of negated values follow from that list.

use std::fmt;
use std::os::raw::c_int;

use crate::*;

/// A libfabric error code (`FI_E*`, positive as the headers define it).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Error(c_int);

/// What a provider function returns inside the provider.
pub type Result<T> = std::result::Result<T, Error>;

macro_rules! codes {
    ($($name:ident = $fi:ident,)*) => {
        impl Error {
            $(
                #[doc = concat!("`", stringify!($fi), "`")]
                pub const $name: Error = Error($fi as c_int);
            )*

            /// Every code this type knows, with its header name.
            pub const ALL: &[(Error, &str)] = &[$((Error::$name, stringify!($fi)),)*];
        }

        /// The negated codes, as entry points returning `int` return them.
        pub mod ret {
            use std::os::raw::c_int;
            use super::Error;
            /// `FI_SUCCESS`.
            pub const SUCCESS: c_int = crate::FI_SUCCESS;
            $(
                #[doc = concat!("`-", stringify!($fi), "`")]
                pub const $name: c_int = Error::$name.ret();
            )*
        }
    };
}

codes! {
    EPERM = FI_EPERM,
    ENOENT = FI_ENOENT,
    EINTR = FI_EINTR,
    EIO = FI_EIO,
    E2BIG = FI_E2BIG,
    EBADF = FI_EBADF,
    EAGAIN = FI_EAGAIN,
    ENOMEM = FI_ENOMEM,
    EACCES = FI_EACCES,
    EFAULT = FI_EFAULT,
    EBUSY = FI_EBUSY,
    ENODEV = FI_ENODEV,
    EINVAL = FI_EINVAL,
    EMFILE = FI_EMFILE,
    ENOSPC = FI_ENOSPC,
    ENOSYS = FI_ENOSYS,
    ENOMSG = FI_ENOMSG,
    ENODATA = FI_ENODATA,
    EOVERFLOW = FI_EOVERFLOW,
    EMSGSIZE = FI_EMSGSIZE,
    ENOPROTOOPT = FI_ENOPROTOOPT,
    EOPNOTSUPP = FI_EOPNOTSUPP,
    EADDRINUSE = FI_EADDRINUSE,
    EADDRNOTAVAIL = FI_EADDRNOTAVAIL,
    ENETDOWN = FI_ENETDOWN,
    ENETUNREACH = FI_ENETUNREACH,
    ECONNABORTED = FI_ECONNABORTED,
    ECONNRESET = FI_ECONNRESET,
    ENOBUFS = FI_ENOBUFS,
    EISCONN = FI_EISCONN,
    ENOTCONN = FI_ENOTCONN,
    ESHUTDOWN = FI_ESHUTDOWN,
    ETIMEDOUT = FI_ETIMEDOUT,
    ECONNREFUSED = FI_ECONNREFUSED,
    EHOSTDOWN = FI_EHOSTDOWN,
    EHOSTUNREACH = FI_EHOSTUNREACH,
    EALREADY = FI_EALREADY,
    EINPROGRESS = FI_EINPROGRESS,
    EREMOTEIO = FI_EREMOTEIO,
    ECANCELED = FI_ECANCELED,
    EKEYREJECTED = FI_EKEYREJECTED,
    EOTHER = FI_EOTHER,
    ETOOSMALL = FI_ETOOSMALL,
    EOPBADSTATE = FI_EOPBADSTATE,
    EAVAIL = FI_EAVAIL,
    EBADFLAGS = FI_EBADFLAGS,
    ENOEQ = FI_ENOEQ,
    EDOMAIN = FI_EDOMAIN,
    ENOCQ = FI_ENOCQ,
    ECRC = FI_ECRC,
    ETRUNC = FI_ETRUNC,
    ENOKEY = FI_ENOKEY,
    ENOAV = FI_ENOAV,
    EOVERRUN = FI_EOVERRUN,
    ENORX = FI_ENORX,
}

impl Error {
    /// The positive code (`FI_EINVAL`), as completion error entries carry it.
    pub const fn code(self) -> c_int {
        self.0
    }

    /// The negated code, as an entry point returning `int` returns it.
    pub const fn ret(self) -> c_int {
        -self.0
    }

    /// The negated code, as an entry point returning `ssize_t` returns it.
    pub const fn ssize(self) -> isize {
        -(self.0 as isize)
    }

    /// The error a negated return value stands for (`None` for success or a
    /// count). Codes this type does not list are kept as they are.
    pub fn from_ret(ret: isize) -> Option<Error> {
        (ret < 0 && ret >= -(c_int::MAX as isize)).then(|| Error(-ret as c_int))
    }

    /// The header's name of the code (`"FI_EINVAL"`), if it is one of ours.
    pub fn name(self) -> Option<&'static str> {
        Error::ALL.iter().find(|(e, _)| *e == self).map(|(_, n)| *n)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "Error({})", self.0),
        }
    }
}

/// The core's text for the code (`fi_strerror`), or the name and number.
impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::core::strerror(self.0))
    }
}

impl std::error::Error for Error {}

/// An `int` entry point's return value: 0 or the negated code.
pub fn ret_of(r: Result<()>) -> c_int {
    match r {
        Ok(()) => FI_SUCCESS,
        Err(e) => e.ret(),
    }
}

/// An `ssize_t` entry point's return value: 0 or the negated code.
pub fn ssize_of(r: Result<()>) -> isize {
    match r {
        Ok(()) => 0,
        Err(e) => e.ssize(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_and_round_trip() {
        for (i, (e, name)) in Error::ALL.iter().enumerate() {
            assert!(e.code() > 0, "{name}");
            assert_eq!(Error::from_ret(e.ssize()), Some(*e), "{name}");
            assert_eq!(e.name(), Some(*name));
            for (other, other_name) in &Error::ALL[i + 1..] {
                // FI_EWOULDBLOCK is FI_EAGAIN on Linux, so it is not listed.
                assert_ne!(e, other, "{name} and {other_name}");
            }
        }
        assert_eq!(ret::EINVAL, -(FI_EINVAL as c_int));
        assert_eq!(ret::EOTHER, -(FI_EOTHER as c_int));
        assert_eq!(Error::from_ret(0), None);
        assert_eq!(Error::from_ret(5), None);
        assert_eq!(ssize_of(Err(Error::EAGAIN)), -(FI_EAGAIN as isize));
        assert_eq!(ret_of(Ok(())), 0);
    }
}
