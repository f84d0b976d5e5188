//! Lists and strings whose decoders refuse more than a bound before allocating for it.

use super::error::ProtoError;
use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;

/// A `Vec` of at most `N` elements, whose deserializer refuses a longer length prefix before
/// allocating and stops at `N` elements even without one.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct BoundedVec<T, const N: usize>(pub(super) Vec<T>);

impl<T, const N: usize> BoundedVec<T, N> {
    /// No elements.
    pub const fn empty() -> Self {
        BoundedVec(Vec::new())
    }

    /// Wraps `v`, refusing more than `N` elements.
    pub fn new(v: Vec<T>) -> Result<Self, ProtoError> {
        if v.len() > N {
            return Err(ProtoError::Limit { what: "list length", got: v.len() as u64, max: N as u64 });
        }
        Ok(BoundedVec(v))
    }

    /// The elements.
    pub fn into_inner(self) -> Vec<T> {
        self.0
    }
}

impl<T, const N: usize> Deref for BoundedVec<T, N> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.0
    }
}

impl<T: fmt::Debug, const N: usize> fmt::Debug for BoundedVec<T, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<T: Serialize, const N: usize> Serialize for BoundedVec<T, N> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de, T: Deserialize<'de>, const N: usize> Deserialize<'de> for BoundedVec<T, N> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T, const N: usize>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>, const N: usize> Visitor<'de> for V<T, N> {
            type Value = BoundedVec<T, N>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a list of at most {N} elements")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let hint = seq.size_hint().unwrap_or(0);
                if hint > N {
                    return Err(de::Error::invalid_length(hint, &self));
                }
                let mut v = Vec::with_capacity(hint);
                while let Some(x) = seq.next_element()? {
                    if v.len() == N {
                        return Err(de::Error::invalid_length(N + 1, &self));
                    }
                    v.push(x);
                }
                Ok(BoundedVec(v))
            }
        }
        d.deserialize_seq(V::<T, N>(PhantomData))
    }
}

/// A UTF-8 string of at most `N` bytes, whose deserializer checks the length before copying.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct BoundedString<const N: usize>(pub(super) String);

impl<const N: usize> BoundedString<N> {
    /// Wraps `s`, refusing more than `N` bytes.
    pub fn new(s: impl Into<String>) -> Result<Self, ProtoError> {
        let s = s.into();
        if s.len() > N {
            return Err(ProtoError::Limit { what: "string length", got: s.len() as u64, max: N as u64 });
        }
        Ok(BoundedString(s))
    }

    /// Wraps `s`, cutting it to at most `N` bytes at a character boundary (for error texts).
    pub fn truncating(s: &str) -> Self {
        let mut end = s.len().min(N);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        BoundedString(s[..end].to_owned())
    }

    /// The string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The owned string.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl<const N: usize> Deref for BoundedString<N> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl<const N: usize> fmt::Debug for BoundedString<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<const N: usize> fmt::Display for BoundedString<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<const N: usize> TryFrom<&str> for BoundedString<N> {
    type Error = ProtoError;
    fn try_from(s: &str) -> Result<Self, ProtoError> {
        Self::new(s)
    }
}

impl<const N: usize> TryFrom<String> for BoundedString<N> {
    type Error = ProtoError;
    fn try_from(s: String) -> Result<Self, ProtoError> {
        Self::new(s)
    }
}

impl<const N: usize> Serialize for BoundedString<N> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de, const N: usize> Deserialize<'de> for BoundedString<N> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<const N: usize>;
        impl<const N: usize> Visitor<'_> for V<N> {
            type Value = BoundedString<N>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a string of at most {N} bytes")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                if s.len() > N {
                    return Err(E::invalid_length(s.len(), &self));
                }
                Ok(BoundedString(s.to_owned()))
            }
        }
        d.deserialize_str(V::<N>)
    }
}
