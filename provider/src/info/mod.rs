//! `fi_info`: what the provider offers (templates), how an application's
//! hints are matched against it (`attr`), `fi_getinfo` itself with node
//! and service resolution (`getinfo`), and the address strings endpoints
//! are named by (`addr`). Depends only on `base`.

pub mod addr;
pub mod attr;
pub mod getinfo;
