package fedsched

import (
	"fmt"
	"math"
	"sort"

	fwk "k8s.io/kube-scheduler/framework"
)

// The agent's weight terms (fedsched.common.learning.nets.WEIGHT_TERMS): for each resource r
// in cpu, mem, io, net, gpu a "free" term x = the node's free share of r after placing the pod
// (LeastAllocated-like) and a "load" term 1 - x (MostAllocated-like).
var resources = [...]string{"cpu", "mem", "io", "net", "gpu"}

const nResources = len(resources)

// termWeights are a GetSchedulingWeights answer: free[r] and load[r] per resource.
type termWeights struct {
	free, load [nResources]float64
}

// parseWeights checks the agent's weights: every value finite and >= 0, a positive total over
// the known terms. Unknown term names (a newer agent) are returned, not an error; the weights
// are scaled to sum to 1 over the known terms.
func parseWeights(m map[string]float64) (termWeights, []string, error) {
	var w termWeights
	var unknown []string
	sum := 0.0
	for name, v := range m {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return w, nil, fmt.Errorf("weight %q is %v, want a finite value >= 0", name, v)
		}
		k, free, ok := termIndex(name)
		if !ok {
			unknown = append(unknown, name)
			continue
		}
		if free {
			w.free[k] = v
		} else {
			w.load[k] = v
		}
		sum += v
	}
	if !(sum > 0) {
		return w, unknown, fmt.Errorf("the weights of the known terms sum to %v, want > 0", sum)
	}
	for k := range w.free {
		w.free[k] /= sum
		w.load[k] /= sum
	}
	sort.Strings(unknown)
	return w, unknown, nil
}

func termIndex(name string) (k int, free bool, ok bool) {
	for i, r := range resources {
		switch name {
		case "free_" + r:
			return i, true, true
		case "load_" + r:
			return i, false, true
		}
	}
	return 0, false, false
}

// freeShares are the node's free shares after placing the pod, clipped to [0, 1], as the
// agent's features (cpu_after, mem_after, io_after, net_after, gpu_after):
//
//	cpu, mem: (alloc - requested - pod) / alloc, with the actual requests (GetRequested)
//	gpu:      (cap - used - pod) / max(cap, 1) in milli-GPU (a node without GPUs: 0)
//	io, net:  1; Kubernetes objects carry no disk or network requests, and the agent reads
//	          none from them, so its own value is 1 for every node as well.
func freeShares(ni fwk.NodeInfo, r podRequest) [nResources]float64 {
	alloc, req := ni.GetAllocatable(), ni.GetRequested()
	gpuCap, gpuUsed := nodeGPU(ni)
	return [nResources]float64{
		share(alloc.GetMilliCPU(), req.GetMilliCPU()+r.milliCPU),
		share(alloc.GetMemory(), req.GetMemory()+r.memory),
		1,
		1,
		clip01(float64(gpuCap-gpuUsed-r.gpuMilli) / float64(max(gpuCap, 1))),
	}
}

func share(capacity, requested int64) float64 {
	if capacity <= 0 {
		return 0
	}
	return clip01(float64(capacity-requested) / float64(capacity))
}

func clip01(x float64) float64 { return math.Min(1, math.Max(0, x)) }

// weightedScore is the weight policy's score of a node, the weighted mean the agent's
// WeightScheduler ranks nodes by, on kube's 0..100 scale:
//
//	score = round(100 * sum_r (w_free_r * x_r + w_load_r * (1 - x_r)))   (weights summing to 1)
func weightedScore(w termWeights, x [nResources]float64) int64 {
	s := 0.0
	for k := range x {
		s += w.free[k]*x[k] + w.load[k]*(1-x[k])
	}
	return clamp(int64(math.Round(s * float64(fwk.MaxNodeScore))))
}

func clamp(s int64) int64 {
	return min(max(s, fwk.MinNodeScore), fwk.MaxNodeScore)
}
