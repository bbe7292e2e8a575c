package subjects

// Request headers, set by the gateway (or a direct NATS client). NATS headers
// are case-sensitive: these spellings are normative.
const (
	HdrRequestID       = "Llm-Request-Id"
	HdrClientRequestID = "Llm-Client-Request-Id"
	HdrModel           = "Llm-Model"
	HdrEndpoint        = "Llm-Endpoint"
	HdrConversation    = "Llm-Conversation"
	HdrPriority        = "Llm-Priority"
	HdrPromptTokens    = "Llm-Prompt-Tokens"
	HdrMaxTokens       = "Llm-Max-Tokens"
	HdrPrefix          = "Llm-Prefix"
	HdrFeatures        = "Llm-Features"
	HdrDeadline        = "Llm-Deadline"
	// HdrTTFTObjective is the request's time-to-first-token objective, a
	// Go duration (ParseTTFTObjective), from X-Switchyard-TTFT-Objective.
	HdrTTFTObjective = "Llm-TTFT-Objective"
	HdrExclude       = "Llm-Exclude"
	// HdrAvoid names the replicas a retry should go to only when no other
	// candidate is left: they were slow to accept this request, which is
	// no evidence that they failed (a replica that failed is in
	// Llm-Exclude).
	HdrAvoid  = "Llm-Avoid"
	HdrStream = "Llm-Stream"
	// HdrColdWaited marks a request the gateway held while its cold model
	// loaded: the broker charged its request quota when it was held, so the
	// attempt after the wait is not charged again.
	HdrColdWaited = "Llm-Cold-Waited"
	// HdrMethod is the engine call's HTTP method when it is not POST: GET
	// or DELETE of a stored response (/v1/responses/<id>).
	HdrMethod = "Llm-Method"
	// HdrPreviousResponse is the stored response a request continues
	// (previous_response_id) or reads: it routes to the replica holding it.
	HdrPreviousResponse = "Llm-Previous-Response"
	// HdrResume marks a continuation: the request re-issued, with the text
	// generated so far, after the replica it names failed mid-answer (or
	// handed it back while draining). It was admitted once: a broker does
	// not check or charge the tenant's quota again, and the adapter reports
	// its usage as the rest of that request's.
	HdrResume = "Llm-Resume"
	// HdrResumeTokens is the completion tokens a continuation carries.
	HdrResumeTokens = "Llm-Resume-Tokens"
	// HdrBudgetHold is "<holder> <budget key>", one value for each budget
	// a request's worst case was reserved against (the tenant's, then the
	// key's): the decider's lease and the budget's key in the budgets
	// bucket. The adapter copies them into the ledger record.
	HdrBudgetHold  = "Llm-Budget-Hold"
	HdrTraceparent = "traceparent"
	HdrTracestate  = "tracestate"
	// HdrTenant and HdrBroker are added by the broker when it forwards: the
	// adapter reports usage for the tenant back to the broker that reserved it.
	HdrTenant = "Llm-Tenant"
	HdrBroker = "Llm-Broker"
	// HdrPredictedTTFT is the time to first token, in whole ms, the
	// decider predicted for the request on the replica it chose: the
	// adapter sends it back with what it observed (LoadDelta.TTFT).
	HdrPredictedTTFT = "Llm-Predicted-TTFT"
	// HdrReply carries a direct client's reply subject when it is a
	// service-import reply (_R_.…): the server refuses such a subject as a
	// published message's reply, so the broker forwards it here and the
	// adapter answers on it. The broker always overwrites or removes it.
	HdrReply = "Llm-Reply"
	// HdrPrefillCancel marks the cancel of the prefill leg named by its
	// Llm-Request-Id: the decode replica's client went away. It is believed
	// only on llm.replica.<prefill>.prefill.cancel.<decode>, which only the
	// decode replica's adapter may publish, and only for a leg that decode
	// replica sent (Subjects.PrefillCancel).
	HdrPrefillCancel = "Llm-Prefill-Cancel"
	// HdrKey is the sha256 hex of the API key a gateway authenticated the
	// request with: the decider charges the key's budget too. Only a
	// gateway may set it (a direct client's is removed).
	HdrKey = "Llm-Key"
	// HdrPrice is the price the decider admitted the request at, set (or
	// removed) by the decider on every forward: input, cached input and
	// output micro-units per million tokens and the batch factor in
	// thousandths (budget.Price.Header). The adapter charges its ledger
	// record at it: the price in force at admission is the price paid.
	HdrPrice = "Llm-Price"
	// HdrKeyID is the id of the request's API key (the first 12 hex digits
	// of its hash), which the ledger records; set or removed by the decider.
	HdrKeyID = "Llm-Key-Id"
)

// Route headers, added by the broker and echoed by the adapter on its head.
const (
	HdrRouteModel    = "Llm-Route-Model"
	HdrRouteVersion  = "Llm-Route-Version"
	HdrRoutePool     = "Llm-Route-Pool"
	HdrRouteReplica  = "Llm-Route-Replica"
	HdrRouteReason   = "Llm-Route-Reason"
	HdrRouteLora     = "Llm-Route-Lora"
	HdrRouteTableRev = "Llm-Route-Table-Rev"
	// HdrRoutePrefill names the replica that runs the prefill leg of a
	// split request (docs/protocol.md, "Disaggregated serving"): the decode
	// replica's adapter sends it the leg. Absent when served whole.
	HdrRoutePrefill = "Llm-Route-Prefill"
	// HdrRouteBudget is what is left of the request's budget (the smaller
	// of its tenant's and its key's) after its reservation, an amount in
	// the table's currency: X-Switchyard-Budget-Remaining.
	HdrRouteBudget = "Llm-Route-Budget-Remaining"
)

// RouteHeaders lists the route headers in the order they are copied to HTTP,
// with the HTTP name of each.
func RouteHeaders() [8][2]string {
	return [8][2]string{
		{HdrRouteModel, "X-Switchyard-Model"},
		{HdrRouteVersion, "X-Switchyard-Version"},
		{HdrRoutePool, "X-Switchyard-Pool"},
		{HdrRouteReplica, "X-Switchyard-Replica"},
		{HdrRouteReason, "X-Switchyard-Reason"},
		{HdrRouteLora, "X-Switchyard-Lora"},
		{HdrRoutePrefill, "X-Switchyard-Prefill-Replica"},
		{HdrRouteBudget, HdrBudgetRemaining},
	}
}

// Reply protocol headers. Every message on a reply subject has Llm-Seq,
// except the broker's routed notice (HdrRouted).
const (
	HdrSeq      = "Llm-Seq"
	HdrAccepted = "Llm-Accepted"
	// HdrHeld rides with Llm-Accepted: how long the adapter held the accept
	// back to send it with the engine's head, in whole microseconds
	// (0 to MaxAcceptHeld), so a gateway can tell the router's own part of
	// the time to the accept from the engine's.
	HdrHeld   = "Llm-Held"
	HdrStatus = "Llm-Status"
	// HdrKeepalive marks a keepalive. A keepalive repeats the Llm-Seq of the
	// last message sent before it and does not advance the sequence, so the
	// head stays seq 1 and data starts at seq 2 however long the prefill.
	HdrKeepalive = "Llm-Keepalive"
	HdrEOS       = "Llm-Eos"
	// HdrRouted marks the broker's routed notice: a header-only message
	// without Llm-Seq, sent to the reply subject just before the request is
	// forwarded, naming the chosen replica. It is outside the adapter's
	// sequence; a gateway uses it to exclude a replica that never accepts.
	HdrRouted = "Llm-Routed"
	// HdrPresent marks an adapter's answer to a probe (an empty message on
	// its replica's cancel subject with a reply subject), naming the
	// replica: it is on the bus. Like the routed notice it is outside the
	// sequence, and it says nothing of any request.
	HdrPresent = "Llm-Present"
	// HdrProbe on an empty cancel asks the adapter to answer present: a
	// probe without it (a gateway of an earlier version, which would read
	// the answer as a sequence gap) is not answered.
	HdrProbe = "Llm-Probe"
	HdrError = "Llm-Error"
	// HdrHandover on an end (with Llm-Error) says the replica drained
	// before the answer was over and hands it back: the gateway continues
	// it on another replica.
	HdrHandover = "Llm-Handover"
	HdrContent  = "Content-Type"

	HdrRetryAfter   = "Retry-After"
	HdrRetryAfterMS = "retry-after-ms"

	HdrRateLimitLimitRequests     = "x-ratelimit-limit-requests"
	HdrRateLimitRemainingRequests = "x-ratelimit-remaining-requests"
	HdrRateLimitResetRequests     = "x-ratelimit-reset-requests"
	HdrRateLimitLimitTokens       = "x-ratelimit-limit-tokens"
	HdrRateLimitRemainingTokens   = "x-ratelimit-remaining-tokens"
	HdrRateLimitResetTokens       = "x-ratelimit-reset-tokens"
	// HdrBudgetRemaining is on every answer to a request under a budget:
	// what is left of it (the smaller remainder of the tenant's and the
	// key's), after the request's reservation.
	HdrBudgetRemaining = "X-Switchyard-Budget-Remaining"
)

// PassThroughHeaders are the headers a rejection or head may carry that the
// gateway copies verbatim to the HTTP response.
func PassThroughHeaders() [9]string {
	return [9]string{
		HdrRetryAfter, HdrRetryAfterMS,
		HdrRateLimitLimitRequests, HdrRateLimitRemainingRequests, HdrRateLimitResetRequests,
		HdrRateLimitLimitTokens, HdrRateLimitRemainingTokens, HdrRateLimitResetTokens,
		HdrBudgetRemaining,
	}
}

// Priorities.
const (
	PriorityInteractive = "interactive"
	PriorityBatch       = "batch"
)

// Endpoints the gateway and adapter know.
const (
	EndpointChat        = "/v1/chat/completions"
	EndpointCompletions = "/v1/completions"
	EndpointEmbeddings  = "/v1/embeddings"
	EndpointResponses   = "/v1/responses"
	EndpointMessages    = "/v1/messages"
)

// BaseEndpoints are what every engine serves: a replica that names no
// endpoints in its heartbeat or registration serves these.
func BaseEndpoints() []string {
	return []string{EndpointChat, EndpointCompletions, EndpointEmbeddings}
}

// AllEndpoints are the inference endpoints Switchyard routes.
func AllEndpoints() []string {
	return []string{EndpointChat, EndpointCompletions, EndpointEmbeddings, EndpointResponses, EndpointMessages}
}

// EndpointBit is endpoint's bit in an endpoint set (0 for an unknown one).
func EndpointBit(endpoint string) uint8 {
	for i, e := range AllEndpoints() {
		if e == endpoint {
			return 1 << i
		}
	}
	return 0
}

// EndpointSet is the set of endpoints named; none is the base set.
func EndpointSet(endpoints []string) uint8 {
	if len(endpoints) == 0 {
		endpoints = BaseEndpoints()
	}
	var set uint8
	for _, e := range endpoints {
		set |= EndpointBit(e)
	}
	return set
}

// Keepalive period while the engine has not produced bytes yet.
const KeepaliveEvery = 5
