/* lock.h — the heap lock: a three-state futex mutex (0 free, 1 held, 2 held with waiters), so the
 * uncontended lock and unlock are one atomic instruction each (glibc's mutex costs several times
 * that on the allocation fast path). Contended waiters spin briefly, then sleep in the kernel.
 * Acquire/release atomics make it visible to ThreadSanitizer. Not recursive. It is the mutex of
 * Drepper's "Futexes Are Tricky" (mutex3): unlock decrements, and only a result other than 0
 * (there were waiters: the state was 2, now 1) stores 0 and wakes one; a locker never leaves the
 * state at 1 while it sleeps (it sets 2 before waiting), so none sleeps through that store. */
#ifndef CUALLOC_LOCK_H
#define CUALLOC_LOCK_H

#include <linux/futex.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct cua_lock_s {
    _Atomic uint32_t state;
} cua_lock_t;

#define CUA_LOCK_INIT {0}

static inline void cua_lock_init(cua_lock_t *l) { atomic_store_explicit(&l->state, 0, memory_order_relaxed); }

static inline void cua_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline void cua_lock_wait(cua_lock_t *l, uint32_t c) {
    for (int spin = 0; spin < 100 && c == 1; spin++) {
        cua_cpu_relax();
        c = 0;
        if (atomic_compare_exchange_weak_explicit(&l->state, &c, 1, memory_order_acquire, memory_order_relaxed)) return;
    }
    if (c != 2) c = atomic_exchange_explicit(&l->state, 2, memory_order_acquire);
    while (c != 0) {
        syscall(SYS_futex, &l->state, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
        c = atomic_exchange_explicit(&l->state, 2, memory_order_acquire);
    }
}

static inline void cua_lock(cua_lock_t *l) {
    uint32_t c = 0;
    if (__builtin_expect(atomic_compare_exchange_strong_explicit(&l->state, &c, 1, memory_order_acquire, memory_order_relaxed), 1))
        return;
    cua_lock_wait(l, c);
}

/* The uncontended acquisition alone: true when the lock was free and is now held. On false the
 * caller takes the lock with cua_lock, typically in an out-of-line function, so that a fast path
 * that makes no other call needs no stack frame. */
static inline bool cua_trylock(cua_lock_t *l) {
    uint32_t c = 0;
    return atomic_compare_exchange_strong_explicit(&l->state, &c, 1, memory_order_acquire, memory_order_relaxed);
}

/* Releases the lock without waking a waiter: true when one sleeps, and the caller must then call
 * cua_wake (out of line, for the reason above). The uncontended case is one decrement whose result
 * the branch reads (lock sub, jne), where an exchange needed its result compared. */
static inline bool cua_unlock_nowake(cua_lock_t *l) {
    if (__builtin_expect(atomic_fetch_sub_explicit(&l->state, 1, memory_order_release) == 1, 1)) return false;
    atomic_store_explicit(&l->state, 0, memory_order_release);
    return true;
}

static inline void cua_wake(cua_lock_t *l) { syscall(SYS_futex, &l->state, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0); }

static inline void cua_unlock(cua_lock_t *l) {
    if (__builtin_expect(cua_unlock_nowake(l), 0)) cua_wake(l);
}

#endif
