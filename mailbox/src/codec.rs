//! The one little-endian codec of everything the provider puts on a wire:
//! the mailbox messages (`unimem_proto::wire`) and the network backend's packets
//! (`net/src/packet.rs`).
//!
//! A writer puts fields in order ([`Put`]: into a growing `Vec<u8>`, or an
//! [`ArrayWriter`] of fixed size, such as one mailbox message); a
//! [`Reader`] takes them back in the same order and refuses to read past
//! the end: a peer's bytes are untrusted input, and a field that is not
//! there is `None`, never a panic. Every function is `#[inline]`: the
//! mailbox messages go through here once each, on the data path.

/// A sink of little-endian fields, written in order.
pub trait Put {
    /// Appends `bytes` as they are.
    fn put(&mut self, bytes: &[u8]) -> &mut Self;

    #[inline]
    fn put_u8(&mut self, value: u8) -> &mut Self {
        self.put(&[value])
    }

    #[inline]
    fn put_u16(&mut self, value: u16) -> &mut Self {
        self.put(&value.to_le_bytes())
    }

    #[inline]
    fn put_u32(&mut self, value: u32) -> &mut Self {
        self.put(&value.to_le_bytes())
    }

    #[inline]
    fn put_u64(&mut self, value: u64) -> &mut Self {
        self.put(&value.to_le_bytes())
    }
}

impl Put for Vec<u8> {
    #[inline]
    fn put(&mut self, bytes: &[u8]) -> &mut Self {
        self.extend_from_slice(bytes);
        self
    }
}

/// Writes fields into an array of `N` bytes, zeros past the last. Writing
/// past its end is a bug of the layout, not of the input: it panics.
pub struct ArrayWriter<const N: usize> {
    buf: [u8; N],
    at: usize,
}

impl<const N: usize> ArrayWriter<N> {
    #[inline]
    pub fn new() -> ArrayWriter<N> {
        ArrayWriter { buf: [0; N], at: 0 }
    }

    /// Bytes written so far.
    #[inline]
    pub fn len(&self) -> usize {
        self.at
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.at == 0
    }

    /// The array: the fields written, then zeros.
    #[inline]
    pub fn finish(self) -> [u8; N] {
        self.buf
    }
}

impl<const N: usize> Default for ArrayWriter<N> {
    #[inline]
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> Put for ArrayWriter<N> {
    #[inline]
    fn put(&mut self, bytes: &[u8]) -> &mut Self {
        self.buf[self.at..self.at + bytes.len()].copy_from_slice(bytes);
        self.at += bytes.len();
        self
    }
}

/// Reads little-endian fields in order, refusing to read past the end.
pub struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    #[inline]
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes }
    }

    /// The next `n` bytes, if there are that many.
    #[inline]
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < n {
            return None;
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Some(head)
    }

    /// The next `N` bytes, by value.
    #[inline]
    pub fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    #[inline]
    pub fn u8(&mut self) -> Option<u8> {
        Some(self.array::<1>()?[0])
    }

    #[inline]
    pub fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.array()?))
    }

    #[inline]
    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.array()?))
    }

    #[inline]
    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.array()?))
    }

    /// What is left unread.
    #[inline]
    pub fn rest(&self) -> &'a [u8] {
        self.bytes
    }

    /// Whether everything was read.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_little_endian_and_read_back_in_order() {
        let mut out = Vec::new();
        out.put_u8(1)
            .put_u16(0x0302)
            .put_u32(0x0706_0504)
            .put_u64(0x0f0e_0d0c_0b0a_0908)
            .put(&[0x10]);
        assert_eq!(out, (1..=0x10).collect::<Vec<u8>>());
        let mut fixed = ArrayWriter::<20>::new();
        fixed.put_u8(1).put_u16(0x0302).put_u32(0x0706_0504);
        assert_eq!(fixed.len(), 7);
        let fixed = fixed.finish();
        assert_eq!(&fixed[..7], &out[..7]);
        assert_eq!(fixed[7..], [0; 13]);
        let mut r = Reader::new(&out);
        assert_eq!(r.u8(), Some(1));
        assert_eq!(r.u16(), Some(0x0302));
        assert_eq!(r.u32(), Some(0x0706_0504));
        assert_eq!(r.u64(), Some(0x0f0e_0d0c_0b0a_0908));
        assert_eq!(r.rest(), &[0x10]);
        assert!(!r.is_empty());
        assert_eq!(r.array::<1>(), Some([0x10]));
        assert!(r.is_empty());
    }

    #[test]
    fn a_reader_never_reads_past_the_end() {
        let bytes = [1, 2, 3];
        let mut r = Reader::new(&bytes);
        assert_eq!(r.u32(), None);
        // A refused read takes nothing.
        assert_eq!(r.u16(), Some(0x0201));
        assert_eq!(r.u16(), None);
        assert_eq!(r.take(2), None);
        assert_eq!(r.u8(), Some(3));
        assert_eq!(r.u8(), None);
        assert_eq!(r.u64(), None);
        assert_eq!(r.take(0), Some(&[][..]));
    }

    #[test]
    #[should_panic]
    fn writing_past_an_array_is_a_bug() {
        ArrayWriter::<3>::new().put_u32(0);
    }
}
