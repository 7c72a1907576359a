/* graph.cu - whole steps as CUDA graphs (the backend's graph_begin / graph_end / graph_reset).
 *
 * The forward keys a step by everything that shapes its launches (rows, logit rows, which
 * variant of the step) and brackets the step's ops with graph_begin(key) and graph_end. Per key:
 * the first step runs eagerly (lazy tables, scratch growth, shared-memory limits happen then);
 * the second is captured (cudaStreamBeginCapture: the ops are recorded, not run), instantiated
 * and launched; later ones replay the executable graph, which skips the host's launch work and
 * the gaps between kernels. A graph holds the device addresses it was captured with: it is
 * replayed only while the scratch buffers have not moved (c->scratch_gen), and the forward
 * drops every graph (graph_reset) when its buffers change. Anything that cannot be captured
 * (a scratch buffer that must grow, a copy from pageable host memory, a failing op) marks the
 * capture bad: graph_end then answers DSI_GRAPH_RETRY, the forward issues the ops again
 * eagerly, and that key is never captured again.
 *
 * Ownership: the graphs belong to the backend context (freed by graph_reset and cuda_free). */
#include "common.cuh"

#define CU_MAX_GRAPHS 512

struct cu_graph {
    uint64_t key;
    int state; /* 0: new, 2: seen once (capture next), 1: captured, -1: not capturable */
    uint64_t gen;
    cudaGraphExec_t exec;
};

extern "C" void cuda_graph_reset(struct dsi_backend *be) {
    struct cu_ctx *c = cu_ctx_of(be);
    for (int i = 0; i < c->n_graphs; i++)
        if (c->graphs[i].exec) cudaGraphExecDestroy(c->graphs[i].exec);
    free(c->graphs);
    c->graphs = NULL;
    c->n_graphs = 0;
    c->cur_graph = -1;
}

static int find_graph(struct cu_ctx *c, uint64_t key) {
    for (int i = 0; i < c->n_graphs; i++)
        if (c->graphs[i].key == key) return i;
    if (!c->graphs) {
        c->graphs = (struct cu_graph *)dsi_calloc(CU_MAX_GRAPHS, sizeof(struct cu_graph));
        if (!c->graphs) return -1;
    }
    if (c->n_graphs == CU_MAX_GRAPHS) return -1;
    c->graphs[c->n_graphs] = (struct cu_graph){key, 0, 0, NULL};
    return c->n_graphs++;
}

extern "C" int cuda_graph_begin(struct dsi_backend *be, uint64_t key) {
    struct cu_ctx *c = cu_ctx_of(be);
    c->cur_graph = -1;
    /* the key's low 20 bits: the step's rows (backend.h) */
    c->pdl = c->pdl_mode == 2 || (c->pdl_mode == 1 && (int64_t)(key & 0xfffff) <= c->pdl_max);
    if (!c->use_graphs || c->sticky) return DSI_GRAPH_EAGER;
    int i = find_graph(c, key);
    if (i < 0) return DSI_GRAPH_EAGER;
    struct cu_graph *g = &c->graphs[i];
    if (g->state == 1 && g->gen != c->scratch_gen) { /* scratch moved: capture again */
        cudaGraphExecDestroy(g->exec);
        g->exec = NULL;
        g->state = 2;
    }
    if (g->state == 1) {
        c->cur_graph = i;
        return DSI_GRAPH_REPLAY;
    }
    if (g->state <= 0) { /* first sight (then: seen once), or not capturable */
        if (g->state == 0) g->state = 2;
        return DSI_GRAPH_EAGER;
    }
    cudaGetLastError();
    cu_l2pf_join(c); /* hints of eager steps: not waited for inside the capture */
    if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cudaGetLastError();
        g->state = -1;
        return DSI_GRAPH_EAGER;
    }
    c->cur_graph = i;
    c->capturing = true;
    c->capture_bad = false;
    return DSI_GRAPH_CAPTURE;
}

extern "C" int cuda_graph_end(struct dsi_backend *be) {
    struct cu_ctx *c = cu_ctx_of(be);
    int i = c->cur_graph;
    c->cur_graph = -1;
    c->pdl = c->pdl_mode == 2;
    if (i < 0) return DSI_OK;
    struct cu_graph *g = &c->graphs[i];
    if (!c->capturing) { /* replay */
        cudaError_t e = cudaGraphLaunch(g->exec, c->stream);
        if (e != cudaSuccess) cu_fail(c, DSI_ERR_DEVICE, "graph launch: %s", cudaGetErrorString(e));
        return DSI_OK;
    }
    cudaGraph_t graph = NULL;
    cu_l2pf_join(c); /* a capture joins every stream it forked (the prefetch hints') */
    cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
    c->capturing = false;
    bool bad = c->capture_bad || e != cudaSuccess || !graph;
    cudaGraphExec_t exec = NULL;
    if (!bad && cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) bad = true;
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError(); /* a capture error is not the step's: the eager retry reports its own */
    if (bad) {
        if (exec) cudaGraphExecDestroy(exec);
        g->state = -1;
        return DSI_GRAPH_RETRY;
    }
    g->exec = exec;
    g->state = 1;
    g->gen = c->scratch_gen;
    e = cudaGraphLaunch(exec, c->stream);
    if (e != cudaSuccess) cu_fail(c, DSI_ERR_DEVICE, "graph launch: %s", cudaGetErrorString(e));
    return DSI_OK;
}
