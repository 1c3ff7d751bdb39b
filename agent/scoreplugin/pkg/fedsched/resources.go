package fedsched

import (
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	resourcehelper "k8s.io/component-helpers/resource"
	fwk "k8s.io/kube-scheduler/framework"
)

// The agent's conventions for GPUs (agent/cluster/k8s_objects.py): whole GPUs are the extended
// resource nvidia.com/gpu; a shared GPU is the FGD artefact's annotations (gpu-milli: the share
// of each GPU in thousandths, gpu-count: how many, default 1), which win over nvidia.com/gpu.
// A node's GPU count is nvidia.com/gpu in allocatable, else alibabacloud.com/gpu-count.
const (
	GPUResource            v1.ResourceName = "nvidia.com/gpu"
	GPUCountResource       v1.ResourceName = "alibabacloud.com/gpu-count"
	GPUMilliAnnotation                     = "alibabacloud.com/gpu-milli"
	GPUCountAnnotation                     = "alibabacloud.com/gpu-count"
	MilliPerGPU                            = 1000
	defaultMilliCPURequest int64           = 100               // kube-scheduler's util.DefaultMilliCPURequest
	defaultMemoryRequest   int64           = 200 * 1024 * 1024 // kube-scheduler's util.DefaultMemoryRequest
)

// podRequest is what a pod asks for, as the plugin scores it.
type podRequest struct {
	milliCPU, memory               int64 // the pod's requests (kube's computePodResourceRequest)
	nonZeroMilliCPU, nonZeroMemory int64 // the same with kube's defaults for containers without one
	gpuMilli                       int64 // num_gpu * gpu_milli, the agent's reading
}

var nonZeroDefaults = v1.ResourceList{
	v1.ResourceCPU:    *resource.NewMilliQuantity(defaultMilliCPURequest, resource.DecimalSI),
	v1.ResourceMemory: *resource.NewQuantity(defaultMemoryRequest, resource.DecimalSI),
}

// requestOf computes a pod's requests: the sum over its containers raised to the largest init
// container (sidecars included), plus spec.overhead; pod-level resources when set.
func requestOf(pod *v1.Pod) podRequest {
	reqs := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	nz := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{NonMissingContainerRequests: nonZeroDefaults})
	r := podRequest{
		milliCPU:        reqs.Cpu().MilliValue(),
		memory:          reqs.Memory().Value(),
		nonZeroMilliCPU: nz.Cpu().MilliValue(),
		nonZeroMemory:   nz.Memory().Value(),
	}
	gpu := reqs[GPUResource]
	r.gpuMilli = gpuMilliOf(pod, gpu.Value())
	return r
}

// gpuMilliOf is the pod's GPU request in milli-GPU (num_gpu * gpu_milli) given its whole
// nvidia.com/gpu request: the share annotations when valid, else whole * 1000.
func gpuMilliOf(pod *v1.Pod, whole int64) int64 {
	if milli, ok := sharedGPUMilli(pod); ok {
		return milli
	}
	if whole < 0 {
		return 0
	}
	return whole * MilliPerGPU
}

// sharedGPUMilli reads the share annotations (gpu-milli in 1..1000, gpu-count in 0..64,
// default 1); ok is false when the pod has none or they are malformed (the agent refuses such a
// pod; here it counts as its nvidia.com/gpu request).
func sharedGPUMilli(pod *v1.Pod) (int64, bool) {
	ann := pod.Annotations
	m, ok := ann[GPUMilliAnnotation]
	if !ok {
		return 0, false
	}
	milli, err := strconv.ParseInt(strings.TrimSpace(m), 10, 64)
	if err != nil || milli < 1 || milli > MilliPerGPU {
		return 0, false
	}
	count := int64(1)
	if c, ok := ann[GPUCountAnnotation]; ok {
		n, err := strconv.ParseInt(strings.TrimSpace(c), 10, 64)
		if err != nil || n < 0 || n > 64 || (n > 1 && milli < MilliPerGPU) {
			return 0, false
		}
		count = n
	}
	return count * milli, true
}

// nodeGPU is a node's GPU capacity and use in milli-GPU: whole GPUs from the node's requested
// nvidia.com/gpu, shares from its pods' annotations.
func nodeGPU(ni fwk.NodeInfo) (capacity, used int64) {
	scalar := ni.GetAllocatable().GetScalarResources()
	n := scalar[GPUResource]
	if n == 0 {
		n = scalar[GPUCountResource]
	}
	capacity = n * MilliPerGPU
	used = ni.GetRequested().GetScalarResources()[GPUResource] * MilliPerGPU
	for _, p := range ni.GetPods() {
		pod := p.GetPod()
		if pod == nil {
			continue
		}
		if milli, ok := sharedGPUMilli(pod); ok {
			// the share replaces whatever nvidia.com/gpu the pod also requests
			used += milli - wholeGPUs(pod)*MilliPerGPU
		}
	}
	if used < 0 {
		used = 0
	}
	return capacity, used
}

// wholeGPUs is the pod's nvidia.com/gpu request (0 without a container naming it).
func wholeGPUs(pod *v1.Pod) int64 {
	if !mentionsGPU(pod) {
		return 0
	}
	q := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})[GPUResource]
	return q.Value()
}

// mentionsGPU tells whether any container requests or limits nvidia.com/gpu (cheap pre-check).
func mentionsGPU(pod *v1.Pod) bool {
	for _, cs := range [][]v1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range cs {
			if _, ok := cs[i].Resources.Requests[GPUResource]; ok {
				return true
			}
			if _, ok := cs[i].Resources.Limits[GPUResource]; ok {
				return true
			}
		}
	}
	return false
}

// leastAllocatedScore is the fallback score of a node (Fallback "LeastAllocated"): kube's
// NodeResourcesFit LeastAllocated with its default resources, CPU and memory at weight 1,
//
//	per resource  s_r = (alloc_r - req_r) * 100 / alloc_r   (0 when req_r > alloc_r or alloc_r = 0)
//	score         (s_cpu + s_mem) / 2                        (integer division, as kube's)
//
// where req_r is the node's non-zero requested (GetNonZeroRequested) plus the pod's non-zero
// request (containers without a request count 100m CPU / 200 MiB).
func leastAllocatedScore(ni fwk.NodeInfo, r podRequest) int64 {
	alloc, nz := ni.GetAllocatable(), ni.GetNonZeroRequested()
	cpu := leastRequested(nz.GetMilliCPU()+r.nonZeroMilliCPU, alloc.GetMilliCPU())
	mem := leastRequested(nz.GetMemory()+r.nonZeroMemory, alloc.GetMemory())
	return (cpu + mem) / 2
}

func leastRequested(requested, capacity int64) int64 {
	if capacity <= 0 || requested > capacity {
		return 0
	}
	return (capacity - requested) * fwk.MaxNodeScore / capacity
}
