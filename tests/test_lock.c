/* test_lock.c — the heap lock (lock.h) under contention: threads take it every way the heap does
 * (cua_trylock then cua_lock, cua_lock, cua_unlock, cua_unlock_nowake then cua_wake) and hold it
 * long enough now and then that others sleep in the kernel (some unlocks must find one asleep). No
 * increment of the counter it guards is lost, no waiter sleeps through an unlock (the test would
 * hang: its timeout fails it), and the lock ends free. */
#include <pthread.h>
#include <sched.h>

#include "internal.h"
#include "lock.h"
#include "testutil.h"

enum { THREADS = 8, ROUNDS = 20000 };

static cua_lock_t lock = CUA_LOCK_INIT;
static uint64_t counter; /* guarded by lock */
static _Atomic uint64_t wakes; /* unlocks that found a sleeper (the contended path) */
static pthread_barrier_t start; /* all threads begin together, so that they contend */

static void *worker(void *arg) {
    unsigned id = (unsigned)(uintptr_t)arg;
    pthread_barrier_wait(&start);
    for (unsigned i = 0; i < ROUNDS; i++) {
        if ((i + id) % 2 == 0) {
            if (!cua_trylock(&lock)) cua_lock(&lock);
        } else {
            cua_lock(&lock);
        }
        counter++;
        /* Now and then a long hold: the others spin out and sleep (state 2). */
        if (i % 512 == id) for (int y = 0; y < 20; y++) sched_yield();
        if (i % 3 == 0) {
            if (cua_unlock_nowake(&lock)) {
                cua_wake(&lock);
                atomic_fetch_add(&wakes, 1);
            }
        } else {
            cua_unlock(&lock);
        }
    }
    return NULL;
}

int main(void) {
    pthread_t th[THREADS];
    EXPECT(pthread_barrier_init(&start, NULL, THREADS) == 0, "barrier");
    for (unsigned t = 0; t < THREADS; t++)
        EXPECT(pthread_create(&th[t], NULL, worker, (void *)(uintptr_t)t) == 0, "thread %u", t);
    for (unsigned t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    EXPECT(counter == (uint64_t)THREADS * ROUNDS, "%llu increments for %llu", (unsigned long long)counter,
           (unsigned long long)THREADS * ROUNDS);
    EXPECT(atomic_load(&wakes) > 0, "no unlock found a sleeping waiter: the contended path went untested");
    EXPECT(atomic_load(&lock.state) == 0, "the lock ends free (state %u)", (unsigned)atomic_load(&lock.state));
    EXPECT(cua_trylock(&lock), "and can be taken");
    EXPECT(!cua_unlock_nowake(&lock), "an uncontended unlock wakes nobody");
    pthread_barrier_destroy(&start);
    printf("test_lock: ok (%llu of its unlocks found a waiter asleep)\n", (unsigned long long)atomic_load(&wakes));
    return 0;
}
