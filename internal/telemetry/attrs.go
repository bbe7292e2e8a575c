package telemetry

import "go.opentelemetry.io/otel/attribute"

// The attributes of a routing decision (docs/architecture.md, "Traces").
const (
	AttrModel         = attribute.Key("switchyard.model")
	AttrVersion       = attribute.Key("switchyard.version")
	AttrPool          = attribute.Key("switchyard.pool")
	AttrReplica       = attribute.Key("switchyard.replica")
	AttrReason        = attribute.Key("switchyard.reason")
	AttrTenant        = attribute.Key("switchyard.tenant")
	AttrTableRevision = attribute.Key("switchyard.table_revision")
	// AttrResumeFrom names the replica a continuation took over from;
	// AttrResumeTokens the completion tokens relayed before it.
	AttrResumeFrom   = attribute.Key("switchyard.resume.from")
	AttrResumeTokens = attribute.Key("switchyard.resume.tokens")
	AttrCause        = attribute.Key("switchyard.cause")
	AttrRequestID    = attribute.Key("switchyard.request_id")
)

// The GenAI semantic conventions the engine call carries.
const (
	AttrGenAIOperation         = attribute.Key("gen_ai.operation.name")
	AttrGenAIRequestModel      = attribute.Key("gen_ai.request.model")
	AttrGenAIRequestMaxTokens  = attribute.Key("gen_ai.request.max_tokens")
	AttrGenAIResponseModel     = attribute.Key("gen_ai.response.model")
	AttrGenAIUsageInputTokens  = attribute.Key("gen_ai.usage.input_tokens")
	AttrGenAIUsageOutputTokens = attribute.Key("gen_ai.usage.output_tokens")
)

// The HTTP semantic conventions of the gateway's server span and the
// adapter's engine call.
const (
	AttrHTTPMethod     = attribute.Key("http.request.method")
	AttrHTTPRoute      = attribute.Key("http.route")
	AttrHTTPStatus     = attribute.Key("http.response.status_code")
	AttrURLPath        = attribute.Key("url.path")
	AttrURLFull        = attribute.Key("url.full")
	AttrURLScheme      = attribute.Key("url.scheme")
	AttrServerAddress  = attribute.Key("server.address")
	AttrUserAgent      = attribute.Key("user_agent.original")
	AttrNetworkVersion = attribute.Key("network.protocol.version")
	AttrErrorType      = attribute.Key("error.type")
)

// The events of a request's spans.
const (
	// EventFirstToken is the time to first token: the engine's first byte
	// of a stream.
	EventFirstToken = "gen_ai.first_token"
	// EventRetry and EventResume mark, on the gateway's span, an attempt
	// made again on another replica before the first byte, and a stream
	// continued on another replica after it.
	EventRetry  = "switchyard.retry"
	EventResume = "switchyard.resume"
)
