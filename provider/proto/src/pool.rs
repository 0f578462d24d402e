//! Pools of fixed-size buffers of dmable memory: *bounce buffers* for eager
//! sends, and *staging buffers* for rendezvous fragments on either side. One
//! allocation, carved into equal buffers, so that a peer registers it once
//! and then always hits its registration cache.

use unimem_dma::{DmaBuf, DmaError};

/// One buffer of a pool: its index there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buffer(u32);

pub struct BufferPool {
    memory: DmaBuf,
    buffer_size: usize,
    free: Vec<u32>,
}

impl BufferPool {
    /// Bytes of dmable memory the pool holds.
    pub fn memory_len(&self) -> usize {
        self.memory.len()
    }

    pub fn new(memory: DmaBuf, buffer_size: usize) -> BufferPool {
        let count = memory.len() / buffer_size;
        BufferPool {
            memory,
            buffer_size,
            // Popped from the back: hand out low buffers first, as warm ones.
            free: (0..count as u32).rev().collect(),
        }
    }

    /// Allocates `count` buffers of `buffer_size` bytes with `alloc`.
    pub fn allocate(
        alloc: impl FnOnce(usize) -> Result<DmaBuf, DmaError>,
        buffer_size: usize,
        count: usize,
    ) -> Result<BufferPool, DmaError> {
        Ok(BufferPool::new(
            alloc(buffer_size * count.max(1))?,
            buffer_size,
        ))
    }

    pub fn get(&mut self) -> Option<Buffer> {
        self.free.pop().map(Buffer)
    }

    pub fn put(&mut self, buf: Buffer) {
        debug_assert!(!self.free.contains(&buf.0), "buffer freed twice");
        self.free.push(buf.0);
    }

    pub fn addr(&self, buf: Buffer) -> *mut u8 {
        self.memory
            .as_ptr()
            .wrapping_add(buf.0 as usize * self.buffer_size)
    }

    pub fn buffer_size(&self) -> usize {
        self.buffer_size
    }

    pub fn available(&self) -> usize {
        self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use unimem_dma::{DmaRegion, RegionConfig};

    #[test]
    fn buffers_are_distinct_and_recycled() {
        let region = DmaRegion::for_process(&RegionConfig {
            job: crate::test_job(),
            segment_size: 1 << 20,
            max_size: 1 << 20,
        })
        .unwrap();
        let mut pool = BufferPool::allocate(|len| region.alloc(len), 4096, 3).unwrap();
        let a = pool.get().unwrap();
        let b = pool.get().unwrap();
        let c = pool.get().unwrap();
        assert!(pool.get().is_none());
        assert_eq!(pool.addr(b) as usize - pool.addr(a) as usize, 4096);
        assert_eq!(pool.addr(c) as usize - pool.addr(b) as usize, 4096);
        pool.put(b);
        assert_eq!(pool.get(), Some(b));
    }
}
